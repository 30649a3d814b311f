"""One gRPC stream on an HTTP/2 connection of its own (``tp_rdzv_etcd.client.h2_stream``)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tp_rdzv_etcd.client.gateway import TlsFiles
from tp_rdzv_etcd.client.h2_stream import (
    UNAVAILABLE,
    GrpcStreamEnded,
    H2Stream,
    MessageReader,
    frame_messages,
)
from tp_rdzv_etcd.client.lease_stream import (
    KeepAliveFailed,
    LeaseKeeper,
    decode_response,
    encode_request,
)
from tp_rdzv_etcd.endpoints import Endpoint
from tp_rdzv_etcd.local import LocalEtcd

_KEEP_ALIVE = "/etcdserverpb.Lease/LeaseKeepAlive"


@given(st.lists(st.binary(max_size=300), max_size=20), st.lists(st.integers(1, 400), max_size=30))
def test_messages_come_out_whole_however_the_data_is_cut(
    messages: list[bytes], cuts: list[int]
) -> None:
    data = frame_messages(messages)
    reader = MessageReader()
    out: list[bytes] = []
    start = 0
    for cut in cuts:
        out += reader.feed(data[start : start + cut])
        start += cut
    out += reader.feed(data[start:])
    assert out == messages


@given(st.binary(max_size=2000))
def test_any_bytes_give_messages_or_a_value_error(data: bytes) -> None:
    reader = MessageReader(limit=1000)
    with contextlib.suppress(ValueError):
        for message in reader.feed(data):
            assert len(message) <= 1000


def test_oversize_and_compressed_messages_are_refused_before_they_are_buffered() -> None:
    with pytest.raises(ValueError, match="at most 1024"):
        MessageReader(limit=1024).feed(b"\0" + (1 << 30).to_bytes(4, "big"))
    with pytest.raises(ValueError, match="compressed"):
        MessageReader().feed(b"\1" + (3).to_bytes(4, "big") + b"abc")


@contextlib.contextmanager
def _server(serve: Callable[[socket.socket], None]) -> Iterator[Endpoint]:
    """A loopback TCP server whose every connection ``serve(conn)`` handles."""
    listener = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield Endpoint("http", "127.0.0.1", listener.getsockname()[1])
    finally:
        listener.close()


def _answers_of(endpoint: Endpoint) -> list[bytes]:
    stream = H2Stream(endpoint, TlsFiles(), _KEEP_ALIVE)
    stream.send([encode_request(7)])
    return list(stream.answers())


def test_a_refused_connection_ends_the_stream_as_unavailable() -> None:
    with _server(lambda conn: conn.close()) as endpoint:
        pass  # closed: nothing listens on the port any more
    with pytest.raises(GrpcStreamEnded) as ended:
        _answers_of(endpoint)
    assert ended.value.code == UNAVAILABLE


def test_a_server_that_hangs_up_ends_the_stream_as_unavailable() -> None:
    def hang_up(conn: socket.socket) -> None:
        conn.recv(100)
        conn.close()

    with _server(hang_up) as endpoint, pytest.raises(GrpcStreamEnded) as ended:
        _answers_of(endpoint)
    assert ended.value.code == UNAVAILABLE


def test_a_server_that_is_not_http2_is_a_value_error_and_the_connection_closes() -> None:
    closed = threading.Event()

    def http1(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n" + os.urandom(512))
        with contextlib.suppress(OSError):
            while conn.recv(65536):
                pass
        closed.set()  # the client hung up

    with _server(http1) as endpoint, pytest.raises(ValueError, match="HTTP/2"):
        _answers_of(endpoint)
    assert closed.wait(30)


def test_a_silent_member_fails_the_keep_alive_in_its_time_and_the_next_goes_elsewhere() -> None:
    """A member that takes the connection and never answers (its reads would
    block for ever): the keep-alive fails at its timeout, the stream is closed,
    and the next keep-alive goes to the next member."""
    hung_up = threading.Event()

    def silent(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while conn.recv(65536):
                pass
        hung_up.set()

    with _server(silent) as first, _server(silent) as second:
        keeper = LeaseKeeper([first, second], TlsFiles())
        with pytest.raises(KeepAliveFailed, match="no keep-alive answer in time"):
            keeper.keep_alive(7, timeout=0.5)
        assert hung_up.wait(30)  # the silent member's connection was closed
        assert keeper._current().endpoint == second


class ChunkCountingProxy:
    """A loopback proxy to ``target`` that records the size of every chunk the
    client's side delivers (what one read of the socket got)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.chunks: list[int] = []
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = Endpoint("http", "127.0.0.1", self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            client, _ = self._listener.accept()
            upstream = socket.create_connection(self._target)
            threading.Thread(target=self._back, args=(upstream, client), daemon=True).start()
            with contextlib.suppress(OSError):
                while data := client.recv(65536):
                    self.chunks.append(len(data))
                    upstream.sendall(data)

    @staticmethod
    def _back(upstream: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                client.sendall(data)

    def close(self) -> None:
        self._listener.close()


@pytest.mark.etcd
def test_a_burst_reaches_etcd_in_one_write_and_every_keep_alive_is_answered(
    etcd1: LocalEtcd,
) -> None:
    member = etcd1.members[0]
    grants = [_grant(member.client_url) for _ in range(50)]
    proxy = ChunkCountingProxy(("127.0.0.1", member.client_port))
    stream = H2Stream(proxy.endpoint, TlsFiles(), _KEEP_ALIVE)
    try:
        answers = stream.answers()
        stream.send([encode_request(lease) for lease in grants[:1]])
        assert decode_response(next(answers))[0] == grants[0]  # connected and answering
        before = len(proxy.chunks)
        stream.send([encode_request(lease) for lease in grants])
        answered = [decode_response(next(answers)) for _ in grants]
        assert sorted(lease for lease, _ in answered) == sorted(grants)
        assert all(ttl > 0 for _, ttl in answered)
        # The burst's 50 messages came in one chunk (among the reader's window
        # updates and acknowledgements, which have writes of their own).
        burst = frame_messages([encode_request(lease) for lease in grants])
        assert max(proxy.chunks[before:]) >= len(burst)
    finally:
        stream.close()
        proxy.close()


def _grant(client_url: str) -> int:
    """A new lease of 60 s, through the gateway."""
    request = urllib.request.Request(
        client_url + "/v3/lease/grant", data=json.dumps({"TTL": 60}).encode()
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return int(json.load(answer)["ID"])
