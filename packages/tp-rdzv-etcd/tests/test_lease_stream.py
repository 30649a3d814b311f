"""Keep-alives on one gRPC stream per process (``tp_rdzv_etcd.client.lease_stream``)."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tp_rdzv_etcd import EtcdSession, EtcdStore
from tp_rdzv_etcd.client.lease_stream import decode_response, encode_request
from tp_rdzv_etcd.client.transport import GrpcOrGateway
from tp_rdzv_etcd.local import LocalEtcd
from tp_store import SessionExpiredError, StoreConnectionError


def _response(lease: int, ttl: int, header: bytes = b"\x08\x01\x10\x02") -> bytes:
    """A LeaseKeepAliveResponse as etcd encodes one (header, ID, TTL)."""
    fields = b"\x0a" + bytes([len(header)]) + header
    if lease:
        fields += encode_request(lease).replace(b"\x08", b"\x10", 1)
    if ttl:
        fields += b"\x18" + encode_request(ttl)[1:]
    return fields


@given(st.integers(1, 2**63 - 1), st.integers(0, 2**31))
def test_answers_decode_to_the_lease_and_its_ttl(lease: int, ttl: int) -> None:
    assert decode_response(_response(lease, ttl)) == (lease, ttl)


def test_a_ttl_of_zero_is_left_out_and_reads_as_gone() -> None:
    assert decode_response(_response(0x1234, 0)) == (0x1234, 0)


@given(st.binary(max_size=64))
def test_any_bytes_decode_or_raise_value_error(data: bytes) -> None:
    try:
        lease, ttl = decode_response(data)
    except ValueError:
        return
    assert -(2**63) <= lease < 2**63
    assert -(2**63) <= ttl < 2**63


def test_truncated_answers_are_value_errors() -> None:
    whole = _response(2**40, 15)
    for end in range(1, len(whole)):
        if end in (6, len(whole) - 2):
            continue  # these cuts fall between fields: a shorter valid message
        with pytest.raises(ValueError, match="truncated"):
            decode_response(whole[:end])


def test_bad_lease_transports_are_refused() -> None:
    with pytest.raises(ValueError, match="lease_transport must be one of auto, grpc, gateway"):
        EtcdStore("127.0.0.1:1", lease_transport="udp")
    with pytest.raises(ValueError, match="etcd users need 'gateway'"):
        EtcdStore("127.0.0.1:1", user="u", password="p", lease_transport="grpc")


_STARTED = re.compile(
    r'^grpc_server_started_total\{[^}]*grpc_method="LeaseKeepAlive"[^}]*\} (\S+)$', re.M
)


def _keep_alive_streams(member_url: str) -> int:
    """How many LeaseKeepAlive streams the member has seen opened."""
    with urllib.request.urlopen(member_url + "/metrics", timeout=10) as answer:
        return sum(int(float(n)) for n in _STARTED.findall(answer.read().decode()))


@pytest.mark.etcd
@pytest.mark.parametrize(
    ("transport", "streams"), [("auto", lambda n: 1), ("gateway", lambda n: n)]
)
def test_sessions_of_a_process_share_one_stream(
    etcd_binary: str, transport: str, streams: Callable[[int], int]
) -> None:
    # A cluster of its own: nothing else opens streams on it.
    with LocalEtcd(binary=etcd_binary) as etcd:
        store = EtcdStore(etcd.endpoints, f"/ka/{uuid.uuid4().hex}/", lease_transport=transport)
        # TTLs this short: every keep-alive waits for its answer (none in a burst).
        sessions = [store.open_session(4) for _ in range(5)]
        before = _keep_alive_streams(etcd.members[0].client_url)
        for _ in range(3):
            for session in sessions:
                session.keep_alive()
        opened = _keep_alive_streams(etcd.members[0].client_url) - before
        for session in sessions:
            session.close()
        store.close()
    assert opened == streams(15)


@pytest.mark.etcd
def test_keep_alives_move_to_a_live_member_when_theirs_dies(
    make_cluster: Callable[[int], LocalEtcd],
) -> None:
    cluster = make_cluster(3)
    # Only the stream: a keep-alive it does not deliver is an error here.
    store = EtcdStore(
        cluster.endpoints, f"/ka/{uuid.uuid4().hex}/", timeout=30, lease_transport="grpc"
    )
    session = store.open_session(4)  # this short: every keep-alive waits for its answer
    assert isinstance(session, EtcdSession)
    session.set("present/a", "token")
    session.keep_alive()
    keeper = store._lease_keeper
    assert keeper is not None
    serving = keeper._current().endpoint  # the member the stream is on
    (member,) = [m for m in cluster.members if m.client_url == serving.url]
    member.kill()
    _await(lambda: keeper._current().endpoint != serving, "a stream on another member")
    deadline = time.monotonic() + 2 * session.timeout  # past the TTL
    while time.monotonic() < deadline:
        session.keep_alive()  # on the stream to a live member (after an election)
        time.sleep(0.05)  # a pace, as a node's ticks have
    assert not session.ended
    assert store.get("present/a") == b"token"  # the lease outlived its TTL
    session.close()
    with pytest.raises(SessionExpiredError):
        session.keep_alive()
    store.close()


def _await(condition: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    """Wait for ``condition`` (an answer a reader thread applies), within a generous bound."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.01)


@pytest.mark.etcd
def test_a_recent_sessions_keep_alive_goes_in_a_burst_and_renews_it(etcd1: LocalEtcd) -> None:
    store = EtcdStore(etcd1.endpoints, f"/ka/{uuid.uuid4().hex}/", timeout=30)
    session = store.open_session(30)
    assert isinstance(session, EtcdSession)
    granted = session._renewed
    session.keep_alive()  # returns before its answer: renewed within a third of the TTL
    _await(lambda: session._renewed > granted, "renewal")
    assert not session.ended
    session.close()
    store.close()


@pytest.mark.etcd
def test_a_burst_keep_alive_that_finds_the_lease_gone_ends_the_session(etcd1: LocalEtcd) -> None:
    store = EtcdStore(etcd1.endpoints, f"/ka/{uuid.uuid4().hex}/", timeout=30)
    session = store.open_session(30)
    assert isinstance(session, EtcdSession)
    session.set("present/a", "token")
    store._call("/v3/lease/revoke", {"ID": str(session.lease)})  # as etcd does at expiry
    session.keep_alive()  # unawaited: the answer (TTL 0) comes later
    _await(lambda: session.ended, "end of the session")
    with pytest.raises(SessionExpiredError, match="expired"):
        session.keep_alive()
    with pytest.raises(SessionExpiredError):
        session.set("present/a", "again")
    assert not store.check(["present/a"])
    session.close()
    store.close()


class Http1OnlyProxy:
    """A loopback TCP proxy to ``target`` that closes every HTTP/2 connection (gRPC's)
    at its first bytes, as a proxy that only speaks HTTP/1.1 would."""

    _HTTP2_PREFACE = b"PRI * HTTP/2.0"

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.refused = 0  # HTTP/2 connections closed
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client:
            first = client.recv(len(self._HTTP2_PREFACE), socket.MSG_WAITALL)
            if first.startswith(b"PRI "):
                self.refused += 1
                return
            with socket.create_connection(self.target) as upstream:
                upstream.sendall(first)
                back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
                back.start()
                _pipe(client, upstream)
                back.join(30)

    def close(self) -> None:
        self._listener.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@pytest.mark.etcd
def test_where_grpc_is_blocked_auto_keeps_leases_alive_through_the_gateway(
    etcd1: LocalEtcd,
) -> None:
    member = etcd1.members[0]
    proxy = Http1OnlyProxy(("127.0.0.1", member.client_port))
    try:
        store = EtcdStore(f"http://127.0.0.1:{proxy.port}", f"/ka/{uuid.uuid4().hex}/", timeout=30)
        assert store._lease_keeper is not None  # auto: it tries gRPC first
        session = store.open_session(3)  # 3 s: every keep-alive waits for its answer
        session.set("present/a", "token")
        deadline = time.monotonic() + 2 * session.timeout  # past the TTL
        while time.monotonic() < deadline:
            session.keep_alive()
        assert proxy.refused > 0  # gRPC was tried, and blocked
        assert not session.ended
        assert store.get("present/a") == b"token"  # the lease outlived its TTL
        # The requests found gRPC blocked too and went through the gateway.
        assert isinstance(store._transport, GrpcOrGateway)
        assert store._transport.blocked
        session.close()
        store.close()
        # Without the fallback, the store says gRPC reaches no member.
        url = f"http://127.0.0.1:{proxy.port}"
        grpc_only = EtcdStore(url, f"/ka/{uuid.uuid4().hex}/", timeout=30, transport="grpc")
        with pytest.raises(StoreConnectionError, match="over gRPC: no member can be reached"):
            grpc_only.set("k", "v")
    finally:
        proxy.close()
