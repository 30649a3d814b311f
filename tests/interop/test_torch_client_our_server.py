"""PyTorch's ``torch.distributed.TCPStore`` client against our standalone server.

Every torch store lives in a worker process (see ``conftest.py``); our server
is a ``python -m tp_store`` process; our own client, where one is needed, runs
in the test process.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from datetime import timedelta

import pytest
from interop_support import (
    ANSWER_TIMEOUT,
    STORE_TIMEOUT,
    OurServer,
    RemoteError,
    TorchStore,
    WorkerPool,
    start_our_server,
)

from tp_store import TCPStore
from tp_store.server.store_server import ServerThread, StoreServer

pytestmark = pytest.mark.interop

SHORT = timedelta(seconds=0.3)


@pytest.fixture
def tc(our_server: OurServer, workers: WorkerPool) -> TorchStore:
    """A torch client of our server, in worker 0."""
    (worker,) = workers.get(1)
    return worker.store(host_name=our_server.host, port=our_server.port)


def torch_clients(server: OurServer, workers: WorkerPool, count: int) -> list[TorchStore]:
    """One torch client of ``server`` in each of the first ``count`` workers."""
    return [w.store(host_name=server.host, port=server.port) for w in workers.get(count)]


@pytest.fixture
def ours(our_server: OurServer) -> Iterator[TCPStore]:
    """Our client of our server, in the test process."""
    store = TCPStore(our_server.host, our_server.port, timeout=STORE_TIMEOUT)
    try:
        yield store
    finally:
        store.close()


def result(future: Future[object]) -> object:
    return future.result(timeout=ANSWER_TIMEOUT)


def assert_store_timeout(error: pytest.ExceptionInfo[RemoteError]) -> None:
    assert error.value.is_a("DistStoreError"), error.value
    assert "timeout" in error.value.message, error.value


# -- set / get -----------------------------------------------------------------


def test_set_get(tc: TorchStore) -> None:
    tc.set("key", "value")
    assert tc.get("key") == b"value"
    tc.set("key", "overwritten")
    assert tc.get("key") == b"overwritten"


def test_set_get_binary_empty_and_large_values(tc: TorchStore) -> None:
    binary = bytes(range(256)) * 4
    large = b"x" * (1 << 20)
    tc.set("binary", binary)
    tc.set("empty", b"")
    tc.set("large", large)
    assert tc.get("binary") == binary
    assert tc.get("empty") == b""
    assert tc.get("large") == large


def test_get_waits_until_the_key_is_set(our_server: OurServer, workers: WorkerPool) -> None:
    setter, getter = torch_clients(our_server, workers, 2)
    pending = getter.submit("get", "late")
    assert not setter.check(["late"])
    setter.set("late", "here")
    assert result(pending) == b"here"


def test_torch_workers_meet_as_on_the_bootstrap_store(
    our_server: OurServer, workers: WorkerPool
) -> None:
    # A job's workers: each adds itself, then gets the key the last one sets (its
    # WAIT parks until then); every step is one of the server's direct answers.
    clients = torch_clients(our_server, workers, 4)
    pending = []
    for count, client in enumerate(clients[:-1], start=1):
        assert client.add("workers", 1) == count
        pending.append(client.submit("get", "unique_id"))
    assert clients[-1].add("workers", 1) == len(clients)
    clients[-1].set("unique_id", b"u" * 128)
    assert [result(future) for future in pending] == [b"u" * 128] * 3
    assert clients[0].get("workers") == b"4"


def test_get_of_a_missing_key_times_out_and_the_connection_survives(tc: TorchStore) -> None:
    tc.set_timeout(SHORT)
    with pytest.raises(RemoteError) as error:
        tc.get("missing")
    assert_store_timeout(error)
    assert "/missing" in error.value.message
    tc.set("missing", "now")
    assert tc.get("missing") == b"now"


# -- add / compare_set -----------------------------------------------------------


def test_add(tc: TorchStore) -> None:
    assert tc.add("counter", 5) == 5
    assert tc.add("counter", -7) == -2
    assert tc.add("counter", 0) == -2
    assert tc.get("counter") == b"-2"
    tc.set("text", "41")
    assert tc.add("text", 1) == 42
    assert tc.add("big", 2**62) == 2**62


def test_compare_set_missing_key_and_empty_expected_creates(tc: TorchStore) -> None:
    assert tc.compare_set("cas", "", "first") == b"first"
    assert tc.get("cas") == b"first"


def test_compare_set_missing_key_and_nonempty_expected_stores_nothing(tc: TorchStore) -> None:
    assert tc.compare_set("cas", "expected", "desired") == b"expected"
    assert not tc.check(["cas"])


def test_compare_set_existing_key(tc: TorchStore) -> None:
    tc.set("cas", "old")
    # mismatch: unchanged, the current value comes back
    assert tc.compare_set("cas", "wrong", "new") == b"old"
    assert tc.get("cas") == b"old"
    # match: swapped
    assert tc.compare_set("cas", "old", "new") == b"new"
    assert tc.get("cas") == b"new"


def test_compare_set_wakes_a_waiter(our_server: OurServer, workers: WorkerPool) -> None:
    writer, waiter = torch_clients(our_server, workers, 2)
    pending = waiter.submit("wait", ["cas"])
    assert writer.compare_set("cas", "", "v") == b"v"
    assert result(pending) is None


# -- wait / check ----------------------------------------------------------------


def test_wait_returns_at_once_when_keys_exist(tc: TorchStore) -> None:
    tc.set("a", "1")
    tc.set("b", "2")
    assert tc.wait(["a", "b"]) is None
    assert tc.wait(["a"], timedelta(seconds=1)) is None


def test_wait_blocks_until_every_key_exists(our_server: OurServer, workers: WorkerPool) -> None:
    writer, waiter = torch_clients(our_server, workers, 2)
    pending = waiter.submit("wait", ["w1", "w2"], timedelta(seconds=STORE_TIMEOUT))
    writer.set("w1", "x")
    # the waiter needs both keys; a round trip later it must still be parked
    assert writer.check(["w1"])
    assert not pending.done()
    writer.add("w2", 1)
    assert result(pending) is None


def test_wait_is_woken_by_append_and_multi_set(our_server: OurServer, workers: WorkerPool) -> None:
    writer, waiter = torch_clients(our_server, workers, 2)
    pending = waiter.submit("wait", ["appended", "m2"])
    writer.append("appended", "x")
    writer.multi_set(["m1", "m2"], ["1", "2"])
    assert result(pending) is None


def test_wait_timeout_cancels_and_the_server_stays_healthy(
    our_server: OurServer, workers: WorkerPool
) -> None:
    writer, waiter = torch_clients(our_server, workers, 2)
    # several timeouts in a row on one connection: each sends CANCEL_WAIT
    for attempt in range(3):
        with pytest.raises(RemoteError) as error:
            waiter.wait(["never", f"nor{attempt}"], SHORT)
        assert_store_timeout(error)
        assert "/never" in error.value.message
        our_server.assert_alive()
    # the same connection still works, for plain requests and for a new wait
    waiter.set("after", "1")
    assert waiter.get("after") == b"1"
    pending = waiter.submit("wait", ["later"])
    writer.set("later", "1")
    assert result(pending) is None
    # the keys of the cancelled waits do not wake anything or linger
    writer.set("never", "1")
    waiter.wait(["never"])  # SET has no reply: the writer's may not be served yet
    assert waiter.check(["never"])
    assert sorted(writer.list_keys()) == ["after", "later", "never"]
    # and a fresh connection is served too
    (fresh,) = torch_clients(our_server, workers, 1)
    assert fresh.get("after") == b"1"


def test_check(tc: TorchStore) -> None:
    assert tc.check(["c1"]) is False
    tc.set("c1", "1")
    assert tc.check(["c1"]) is True
    assert tc.check(["c1", "c2"]) is False
    tc.add("c2", 1)
    assert tc.check(["c1", "c2"]) is True


# -- delete_key / num_keys / append / multi_* / list_keys -------------------------


def test_delete_key(tc: TorchStore) -> None:
    tc.set("doomed", "1")
    assert tc.delete_key("doomed") is True
    assert tc.delete_key("doomed") is False
    assert tc.check(["doomed"]) is False


def test_num_keys_counts_every_server_key(our_server: OurServer, workers: WorkerPool) -> None:
    plain, joined = workers.get(2)
    tc = plain.store(host_name=our_server.host, port=our_server.port)
    assert tc.num_keys() == 0
    tc.set("a", "1")
    tc.add("b", 1)
    tc.append("c", "x")
    assert tc.num_keys() == 3
    assert tc.delete_key("a")
    assert tc.num_keys() == 2
    # a client with world_size and wait_for_workers adds the "init/" key
    joined.store(host_name=our_server.host, port=our_server.port, world_size=2)
    assert tc.num_keys() == 3
    assert sorted(tc.list_keys()) == ["b", "c"]


def test_append(tc: TorchStore) -> None:
    tc.append("log", "a")
    tc.append("log", b"\x00bc")
    assert tc.get("log") == b"a\x00bc"


def test_multi_set_and_multi_get(tc: TorchStore) -> None:
    tc.multi_set(["m1", "m2", "m1"], ["one", "two", "uno"])
    assert tc.multi_get(["m2", "m1"]) == [b"two", b"uno"]
    assert tc.multi_get([]) == []


def test_multi_get_waits_for_missing_keys(our_server: OurServer, workers: WorkerPool) -> None:
    writer, reader = torch_clients(our_server, workers, 2)
    writer.set("x1", "1")
    pending = reader.submit("multi_get", ["x1", "x2"])
    writer.set("x2", "2")
    assert result(pending) == [b"1", b"2"]


def test_list_keys(tc: TorchStore) -> None:
    assert tc.list_keys() == []
    tc.set("a", "1")
    tc.add("b", 1)
    tc.append("c", "1")
    tc.multi_set(["d/e"], ["1"])
    assert sorted(tc.list_keys()) == ["a", "b", "c", "d/e"]


# -- queues ----------------------------------------------------------------------


def test_queue_push_pop_len(tc: TorchStore) -> None:
    assert tc.queue_len("q") == 0
    tc.queue_push("q", "first")
    tc.queue_push("q", b"\x00second")
    assert tc.queue_len("q") == 2
    assert tc.queue_pop("q") == b"first"
    assert tc.queue_len("q") == 1
    assert tc.queue_pop("q", block=False) == b"\x00second"
    assert tc.queue_len("q") == 0


def test_queues_live_beside_the_keys(tc: TorchStore) -> None:
    """As on torch's server: a queue is no key, but check/wait see a non-empty one."""
    tc.queue_push("q", "a")
    assert tc.num_keys() == 0
    assert tc.list_keys() == []
    assert tc.check(["q"]) is True
    assert tc.queue_pop("q") == b"a"
    assert tc.check(["q"]) is False
    tc.set("q", "plain")
    tc.queue_push("q", "queued")
    assert tc.get("q") == b"plain"
    assert tc.queue_pop("q") == b"queued"


def test_queue_pop_nonblocking_on_empty_raises(tc: TorchStore) -> None:
    with pytest.raises(RemoteError) as error:
        tc.queue_pop("empty", block=False)
    assert error.value.is_a("QueueEmptyError"), error.value
    # the connection is still fine
    tc.queue_push("empty", "x")
    assert tc.queue_pop("empty", block=False) == b"x"


def test_queue_pop_blocks_until_a_push(our_server: OurServer, workers: WorkerPool) -> None:
    # One blocked popper: torch's blocking pop is WAIT then QUEUE_POP, so with
    # several poppers a push wakes them all and the losers get QueueEmptyError
    # (on torch's own server as well); that race is torch's client design.
    pusher, popper = torch_clients(our_server, workers, 2)
    pending = popper.submit("queue_pop", "jobs")
    assert pusher.queue_len("jobs") == 0
    pusher.queue_push("jobs", "a")
    assert result(pending) == b"a"
    assert pusher.queue_len("jobs") == 0


def test_queue_pop_blocking_times_out(tc: TorchStore) -> None:
    tc.set_timeout(SHORT)
    with pytest.raises(RemoteError) as error:
        tc.queue_pop("never")
    assert error.value.is_a("DistStoreError"), error.value
    tc.queue_push("never", "x")
    assert tc.queue_pop("never") == b"x"


# -- barrier ---------------------------------------------------------------------


def test_barrier_releases_everyone_together(our_server: OurServer, workers: WorkerPool) -> None:
    first, second, third = torch_clients(our_server, workers, 3)
    pending = [first.submit("barrier", "b", 3), second.submit("barrier", "b", 3)]
    assert not any(p.done() for p in pending)
    third.barrier("b", 3)
    assert [result(p) for p in pending] == [None, None]


def test_barrier_timeout_leaves_the_connection_usable(tc: TorchStore) -> None:
    with pytest.raises(RemoteError) as error:
        tc.barrier("lonely", 2, SHORT)
    assert_store_timeout(error)
    tc.set("after", "1")
    assert tc.get("after") == b"1"


# -- sharing keys with our client ------------------------------------------------


def test_torch_and_our_clients_see_each_others_keys(tc: TorchStore, ours: TCPStore) -> None:
    tc.set("from_torch", "t")
    ours.set("from_ours", "o")
    assert ours.get("from_torch") == b"t"
    assert tc.get("from_ours") == b"o"
    assert tc.add("shared", 2) == 2
    assert ours.add("shared", 3) == 5
    assert tc.get("shared") == b"5"
    ours.queue_push("q", "from ours")
    assert tc.queue_pop("q") == b"from ours"
    expected = ["from_ours", "from_torch", "shared"]
    assert sorted(ours.list_keys()) == sorted(tc.list_keys()) == expected
    assert ours.num_keys() == tc.num_keys()


# -- world_size / wait_for_workers -------------------------------------------------


def test_our_master_waits_for_torch_workers(workers: WorkerPool) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    done = threading.Event()
    masters: list[TCPStore] = []
    errors: list[BaseException] = []

    def run_master() -> None:
        try:
            masters.append(
                TCPStore(
                    "127.0.0.1",
                    port,
                    world_size=3,
                    is_master=True,
                    timeout=10.0,
                    wait_for_workers=True,
                    master_listen_fd=listener.detach(),
                )
            )
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=run_master, daemon=True)
    thread.start()
    try:
        first, second = workers.get(2)
        first.store(host_name="127.0.0.1", port=port, world_size=3)
        assert not done.wait(0.3), f"master returned after 1 of 2 workers ({errors})"
        second.store(host_name="127.0.0.1", port=port, world_size=3)
        assert done.wait(ANSWER_TIMEOUT), "master did not return once both workers joined"
        assert not errors, errors
        (master,) = masters
        assert master.port == port
        assert master.num_keys() == 1  # init/
        assert master.list_keys() == []
        master.set("go", "1")
        assert first.store(host_name="127.0.0.1", port=port).get("go") == b"1"
    finally:
        thread.join(ANSWER_TIMEOUT)
        for master in masters:
            master.close()


def test_torch_clients_with_world_size_join_our_standalone_server(
    our_server: OurServer, workers: WorkerPool
) -> None:
    clients = [
        w.store(host_name=our_server.host, port=our_server.port, world_size=3)
        for w in workers.get(3)
    ]
    assert clients[0].num_keys() == 1
    assert clients[0].list_keys() == []


# -- the connection limit --------------------------------------------------------------


def test_a_torch_client_refused_at_the_limit_retries_until_a_slot_frees(
    workers: WorkerPool,
) -> None:
    # Our server says CONNECTION_REFUSED before closing a connection over its
    # max_connections; PyTorch takes it for a wrong PING answer and retries,
    # as it does when the connection is just reset.
    thread = ServerThread(StoreServer("127.0.0.1", 0, max_connections=1))
    thread.start()
    try:
        holder = TCPStore("127.0.0.1", thread.server.port, timeout=STORE_TIMEOUT)
        (worker,) = workers.get(1)
        tc, constructed = worker.store_async(host_name="127.0.0.1", port=thread.server.port)
        deadline = time.monotonic() + ANSWER_TIMEOUT
        while thread.server.stats()["connections_refused"] == 0:
            assert time.monotonic() < deadline, "the torch client was never refused"
            time.sleep(0.01)
        assert not constructed.done()
        holder.close()
        tc.port = result(constructed)
        tc.set("in", "at last")
        assert tc.get("in") == b"at last"
    finally:
        thread.stop()


# -- IPv6 --------------------------------------------------------------------------


def ipv6_loopback_available() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback_available(), reason="no IPv6 loopback here")
def test_torch_client_over_ipv6(workers: WorkerPool) -> None:
    server = start_our_server("::1")
    try:
        assert server.host == "::1"
        (worker,) = workers.get(1)
        tc = worker.store(host_name="::1", port=server.port)
        tc.set("v6", "yes")
        assert tc.get("v6") == b"yes"
        server.assert_alive()
    finally:
        server.stop()
