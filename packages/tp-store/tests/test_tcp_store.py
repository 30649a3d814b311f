"""TCPStore behaviour beyond the Store contract: construction, handshake, server life."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from raw_client import wait_until

from tp_store import StoreConnectionError, StoreTimeoutError, TCPStore
from tp_store.demo import run as run_demo
from tp_store.server.store_server import DEFAULT_BACKLOG
from tp_store.stores.tcp_store import _closed


@pytest.fixture
def master() -> Iterator[TCPStore]:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=10)
    yield store
    store.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_port_zero_picks_a_free_port_and_reports_it(master: TCPStore) -> None:
    assert master.port > 0
    client = TCPStore("127.0.0.1", master.port, timeout=5)
    client.set("k", "v")
    assert master.get("k") == b"v"
    assert master.host == "127.0.0.1"


def test_timeout_accepts_timedelta_and_seconds(master: TCPStore) -> None:
    as_delta = TCPStore("127.0.0.1", master.port, timeout=timedelta(seconds=7))
    as_float = TCPStore("127.0.0.1", master.port, timeout=2.5)
    assert as_delta.timeout == timedelta(seconds=7)
    assert as_float.timeout == timedelta(seconds=2.5)
    as_float.set_timeout(timedelta(milliseconds=100))
    with pytest.raises(StoreTimeoutError):
        as_float.get("never-set")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"port": 70000}, "port"),
        ({"port": -1}, "port"),
        ({"port": 0}, "port 0"),
        ({"port": 1, "world_size": 0}, "world_size"),
        ({"port": 1, "timeout": -1}, "timeout"),
    ],
)
def test_bad_arguments_are_rejected(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TCPStore("127.0.0.1", **kwargs)  # type: ignore[arg-type]


def test_unreachable_server_names_host_and_port() -> None:
    port = _free_port()
    started = time.monotonic()
    with pytest.raises(StoreConnectionError, match=f"127.0.0.1:{port}") as caught:
        TCPStore("127.0.0.1", port, timeout=0.5)
    assert isinstance(caught.value, ConnectionError)
    assert caught.value.port == port
    assert time.monotonic() - started < 5


def test_client_connects_once_a_late_server_starts() -> None:
    port = _free_port()
    clients: list[TCPStore] = []
    connecting = threading.Thread(
        target=lambda: clients.append(TCPStore("127.0.0.1", port, timeout=10))
    )
    connecting.start()
    master = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=10)
    connecting.join()
    clients[0].set("late", "1")
    assert master.get("late") == b"1"
    master.close()


def test_master_waits_for_world_size_users() -> None:
    port = _free_port()
    workers: list[TCPStore] = []
    joined = threading.Event()

    def join_two() -> None:
        workers.extend(TCPStore("127.0.0.1", port, world_size=3, timeout=10) for _ in range(2))
        joined.set()

    thread = threading.Thread(target=join_two)
    thread.start()
    master = TCPStore("127.0.0.1", port, world_size=3, is_master=True, timeout=10)
    thread.join()
    assert joined.is_set()
    assert master.num_keys() == 1  # just the init/ counter
    assert master.list_keys() == []
    master.close()


def test_master_times_out_naming_how_many_joined() -> None:
    with pytest.raises(StoreTimeoutError, match="1 joined"):
        TCPStore("127.0.0.1", 0, world_size=2, is_master=True, timeout=0.3)


def test_second_master_on_a_taken_port_fails_clearly(master: TCPStore) -> None:
    with pytest.raises(StoreConnectionError, match=str(master.port)):
        TCPStore("127.0.0.1", master.port, is_master=True, wait_for_workers=False, timeout=1)


def test_multi_tenant_masters_share_one_server() -> None:
    first = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    second = TCPStore(
        "127.0.0.1", first.port, is_master=True, wait_for_workers=False, multi_tenant=True
    )
    first.set("shared", "yes")
    assert second.get("shared") == b"yes"
    first.close()
    second.set("still", "up")  # the server lives while a tenant remains
    assert second.get("still") == b"up"
    second.close()


# Masters dropped without close, in reference cycles, are finalized by the cyclic
# garbage collector in whichever thread allocates next: with collections at
# nearly every allocation, that happens while the next multi_tenant master
# starts its server (holding the registry's lock, or in the new server's thread).
_COLLECTED_DURING_START = """
import gc, socket
from tp_store import TCPStore
gc.set_threshold(1, 1, 1)
ports = []
for _ in range(20):
    dropped = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    ports.append(dropped.port)
    dropped.cycle = dropped
    del dropped
gc.set_threshold(700, 10, 10)
gc.collect()
for port in ports:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        print("still serving:", port)
    except ConnectionRefusedError:
        pass
"""


def test_a_multi_tenant_master_collected_while_another_starts_does_not_deadlock() -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", _COLLECTED_DURING_START],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("deadlocked: a garbage-collected master's release waited") from exc
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # every collected master's server stopped


def test_closing_a_master_twice_is_harmless() -> None:
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    other = TCPStore(
        "127.0.0.1", master.port, is_master=True, wait_for_workers=False, multi_tenant=True
    )
    master.close()
    master.close()  # counts down once: the other tenant keeps the server
    other.set("still", "up")
    assert other.get("still") == b"up"
    other.close()


def test_master_listen_fd_serves_on_the_given_socket() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    master = TCPStore(
        "127.0.0.1",
        port,
        is_master=True,
        wait_for_workers=False,
        master_listen_fd=listener.detach(),
    )
    TCPStore("127.0.0.1", port).set("via-fd", "1")
    assert master.get("via-fd") == b"1"
    master.close()


def test_clone_is_an_independent_connection(master: TCPStore) -> None:
    clone = master.clone()
    assert clone.port == master.port
    assert clone.server is None
    released = threading.Event()

    def waiter() -> None:
        clone.wait(["gate"])
        released.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    master.set("gate", "open")  # not blocked by the clone's pending wait
    thread.join(5)
    assert released.is_set()


def test_our_client_negotiates_extensions_with_our_server(master: TCPStore) -> None:
    assert master.uses_extensions


def test_client_reconnects_after_the_connection_drops(master: TCPStore) -> None:
    client = TCPStore("127.0.0.1", master.port, timeout=5)
    client.set("before", "1")
    assert master.server is not None
    server = master.server
    # The server drops every connection (as on a protocol error); the client's next
    # call fails clearly, and the one after that reconnects.
    master._server.call(  # type: ignore[union-attr]
        lambda: [conn.close("test") for conn in list(server.connections)]
    )
    with pytest.raises(StoreConnectionError):
        client.get("before")
    assert client.get("before") == b"1"


@pytest.mark.parametrize("how", ["fin", "reset"])
def test_an_idle_connection_the_peer_closed_is_found_closed(how: str) -> None:
    # Checked before a request on an idle connection: a SET (no reply) sent on
    # a closed one would be lost.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        peer, _ = listener.accept()
    with client:
        assert not _closed(client)
        if how == "reset":
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()
        wait_until(lambda: _closed(client), f"the {how} seen")


def test_ipv6_loopback() -> None:
    try:
        master = TCPStore("::1", 0, is_master=True, wait_for_workers=False, timeout=5)
    except StoreConnectionError as exc:  # pragma: no cover - hosts without IPv6
        pytest.skip(f"no IPv6 loopback here: {exc}")
    client = TCPStore("::1", master.port, timeout=5)
    client.set("v6", "yes")
    assert master.get("v6") == b"yes"
    assert master.endpoint == f"[::1]:{master.port}"
    master.close()


def test_standalone_server_serves_until_sigterm() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "tp_store", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("listening on 127.0.0.1:")
    port = int(line.rsplit(":", 1)[1])
    client = TCPStore("127.0.0.1", port, timeout=5)
    assert client.add("n", 2) == 2
    process.send_signal(signal.SIGTERM)
    assert process.wait(10) == 0


@pytest.mark.parametrize(
    "signals",
    [
        [signal.SIGTERM, signal.SIGTERM],
        [signal.SIGINT, signal.SIGTERM],
        [signal.SIGTERM, signal.SIGINT] * 5,
    ],
    ids=["two-sigterms", "sigint-then-sigterm", "ten-mixed"],
)
def test_standalone_server_exits_0_however_many_stop_signals_arrive(
    signals: list[signal.Signals],
) -> None:
    # Supervisors and timeout(1) send a second signal milliseconds after the first;
    # it must not take the default action while the server shuts down or exits.
    process = subprocess.Popen(
        [sys.executable, "-m", "tp_store", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    port = int(process.stdout.readline().rsplit(":", 1)[1])
    client = TCPStore("127.0.0.1", port, timeout=5)  # a connection to close on the way out
    client.set("k", "v")
    for signum in signals:
        process.send_signal(signum)
        time.sleep(0.005)
    assert process.wait(30) == 0, process.stderr.read()
    assert "Traceback" not in process.stderr.read()


def test_standalone_server_rejects_a_bad_port() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tp_store", "--port", "99999"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert "port" in result.stderr
    assert "Traceback" not in result.stderr


def test_demo_runs_workers_through_the_store() -> None:
    import io

    out = io.StringIO()
    summary = run_demo(workers=3, rounds=20, out=out)
    assert summary.ok
    assert summary.adds == 60
    assert "OK: 3 workers" in out.getvalue()


def test_a_connect_the_listener_never_completes_gives_up_at_the_store_timeout() -> None:
    # A listener whose accept queue is full drops further SYNs: the kernel would
    # retry one connect for about two minutes; the store's timeout bounds it.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):  # fills the queue
            began = time.monotonic()
            with pytest.raises(StoreConnectionError, match="timed out after 0:00:01"):
                TCPStore("127.0.0.1", port, timeout=timedelta(seconds=1))
            assert time.monotonic() - began < 30, "the connect outlived the store timeout"


def test_listen_backlog_is_the_one_configured(master: TCPStore) -> None:
    # A short accept queue drops connections in a storm (a second of SYN retries
    # each): the backlog must survive asyncio re-listening with its default of 100.
    assert master.server is not None
    listener = master.server._servers[0].sockets[0]
    with socket.socket(fileno=os.dup(listener.fileno())) as sock:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    max_backlog = struct.unpack_from("<I", info, 28)[0]  # tcpi_sacked, for a listener
    with open("/proc/sys/net/core/somaxconn") as limit:
        assert max_backlog == min(DEFAULT_BACKLOG, int(limit.read()))


def test_queue_pop_many_drains_thousands_in_a_few_sends(master: TCPStore) -> None:
    client = TCPStore("127.0.0.1", master.port, timeout=10)
    for index in range(2500):
        client.queue_push("mailbox", str(index))
    client.queue_push("other", "untouched")
    before = client.server_stats()["ops"]["queue_pop"]
    # Three sends of pipelined pops (1024, 1024, 952; the last finds the queue
    # empty after 452): every value, in order, and the reply stream stays in
    # step for the requests after it.
    values = client.queue_pop_many("mailbox", 3000)
    assert values == [str(index).encode() for index in range(2500)]
    assert client.server_stats()["ops"]["queue_pop"] - before == 3000
    assert client.queue_pop_many("mailbox", 10) == []
    assert client.queue_len("other") == 1
    client.close()


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_server_silent_while_a_wait_is_cancelled_times_the_wait_out() -> None:
    # An overloaded server may answer the CANCEL_WAIT of a timed-out wait later
    # than the store timeout; a stopped one never does. That is a timeout (the
    # caller may wait again), not a lost connection: it surfaced as
    # StoreConnectionError "... during cancelling a wait: [Errno 11]".
    process = subprocess.Popen(
        [sys.executable, "-m", "tp_store", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    port = int(process.stdout.readline().rsplit(":", 1)[1])
    client = TCPStore("127.0.0.1", port, timeout=0.5)
    process.send_signal(signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 30
        while not _stopped(process.pid):
            assert time.monotonic() < deadline, "the server did not stop"
            time.sleep(0.01)
        with pytest.raises(StoreTimeoutError, match="never"):
            client.wait_get("never", 0.2)
    finally:
        process.send_signal(signal.SIGCONT)
    # The connection whose replies went out of step is replaced.
    client.set("k", "v")
    assert client.get("k") == b"v"
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
