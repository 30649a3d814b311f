"""Our ``tp_store.TCPStore`` client against PyTorch's servers, libuv and legacy.

The torch master (and any torch peer client) lives in a worker process (see
``conftest.py``); our clients run in the test process, blocking ones in
threads.

The legacy server (``use_libuv=False``) has no queue opcodes (QUEUE_PUSH is
accepted and ignored, QUEUE_POP/QUEUE_LEN make it drop the connection, for a
torch client too), so the queue tests run against libuv only.

Torch's servers (both) do a reverse DNS lookup when they accept a connection;
in a container whose DNS server does not answer, that stalls the server about
5 s now and then. Connections to a torch server therefore get a generous
timeout (``CONNECT_TIMEOUT``); the tests of timeouts set short ones once
connected.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import timedelta

import pytest
from interop_support import ANSWER_TIMEOUT, TorchStore, WorkerPool

from tp_store import QueueEmptyError, StoreTimeoutError, TCPStore, UnsupportedOperationError

pytestmark = pytest.mark.interop

SHORT = 0.3
#: Store timeout of connections to a torch server (see the module docstring).
CONNECT_TIMEOUT = 20.0


@pytest.fixture(params=[True, False], ids=["libuv", "legacy"])
def master(request: pytest.FixtureRequest, workers: WorkerPool) -> TorchStore:
    """A torch master (server + client) in worker 0, on an ephemeral port."""
    (worker,) = workers.get(1)
    return worker.store(
        host_name="127.0.0.1",
        port=0,
        is_master=True,
        use_libuv=request.param,
        timeout=CONNECT_TIMEOUT,
    )


@pytest.fixture
def libuv_master(workers: WorkerPool) -> TorchStore:
    (worker,) = workers.get(1)
    return worker.store(
        host_name="127.0.0.1", port=0, is_master=True, use_libuv=True, timeout=CONNECT_TIMEOUT
    )


def connect(master: TorchStore, **kwargs: object) -> TCPStore:
    kwargs.setdefault("timeout", CONNECT_TIMEOUT)
    return TCPStore("127.0.0.1", master.port, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def ours(master: TorchStore) -> Iterator[TCPStore]:
    store = connect(master)
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def ours_libuv(libuv_master: TorchStore) -> Iterator[TCPStore]:
    store = connect(libuv_master)
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


def result(future: Future[object]) -> object:
    return future.result(timeout=ANSWER_TIMEOUT)


# -- set / get -----------------------------------------------------------------


def test_set_get(ours: TCPStore) -> None:
    ours.set("key", "value")
    assert ours.get("key") == b"value"
    ours.set(b"key", b"again")
    assert ours.get("key") == b"again"


def test_set_get_binary_empty_and_large_values(ours: TCPStore) -> None:
    binary = bytes(range(256)) * 4
    large = b"x" * (1 << 20)
    ours.set("binary", binary)
    ours.set("empty", b"")
    ours.set("large", large)
    assert ours.get("binary") == binary
    assert ours.get("empty") == b""
    assert ours.get("large") == large


def test_get_waits_until_a_torch_client_sets_the_key(
    master: TorchStore, ours: TCPStore, pool: ThreadPoolExecutor
) -> None:
    pending = pool.submit(ours.get, "late")
    assert not master.check(["late"])
    master.set("late", "here")
    assert result(pending) == b"here"


def test_get_of_a_missing_key_times_out_and_the_connection_survives(
    master: TorchStore, ours: TCPStore
) -> None:
    ours.set_timeout(SHORT)
    with pytest.raises(StoreTimeoutError):
        ours.get("missing")
    # also on the legacy server, which drops a connection that GETs a missing key
    master.set("missing", "now")
    assert ours.get("missing") == b"now"


# -- add / compare_set -----------------------------------------------------------


def test_add(ours: TCPStore, master: TorchStore) -> None:
    assert ours.add("counter", 5) == 5
    assert ours.add("counter", -7) == -2
    assert ours.add("counter", 0) == -2
    assert ours.get("counter") == b"-2"
    assert master.add("counter", 3) == 1
    assert ours.add("big", 2**62) == 2**62


def test_compare_set_missing_key_and_empty_expected_creates(ours: TCPStore) -> None:
    assert ours.compare_set("cas", "", "first") == b"first"
    assert ours.get("cas") == b"first"


def test_compare_set_missing_key_and_nonempty_expected_stores_nothing(ours: TCPStore) -> None:
    assert ours.compare_set("cas", "expected", "desired") == b"expected"
    assert not ours.check(["cas"])


def test_compare_set_existing_key(ours: TCPStore) -> None:
    ours.set("cas", "old")
    assert ours.compare_set("cas", "wrong", "new") == b"old"
    assert ours.get("cas") == b"old"
    assert ours.compare_set("cas", "old", "new") == b"new"
    assert ours.get("cas") == b"new"


# -- wait / check ----------------------------------------------------------------


def test_wait_returns_at_once_when_keys_exist(ours: TCPStore) -> None:
    ours.set("a", "1")
    ours.set("b", "2")
    ours.wait(["a", "b"])
    ours.wait(["a"], timedelta(seconds=1))
    ours.wait(["b"], 1.0)


def test_wait_blocks_until_every_key_exists(
    master: TorchStore, ours: TCPStore, pool: ThreadPoolExecutor
) -> None:
    pending = pool.submit(ours.wait, ["w1", "w2"])
    master.set("w1", "x")
    assert master.check(["w1"])
    assert not pending.done()
    master.add("w2", 1)
    assert result(pending) is None


def test_wait_timeout_cancels_and_the_connection_survives(
    master: TorchStore, ours: TCPStore, pool: ThreadPoolExecutor
) -> None:
    for attempt in range(3):
        with pytest.raises(StoreTimeoutError) as error:
            ours.wait(["never", f"nor{attempt}"], SHORT)
        assert "never" in str(error.value)
    ours.set("after", "1")
    assert ours.get("after") == b"1"
    pending = pool.submit(ours.wait, ["later"])
    master.set("later", "1")
    assert result(pending) is None
    # a torch client of the same server is unaffected
    assert master.get("after") == b"1"


def test_check(ours: TCPStore) -> None:
    assert ours.check(["c1"]) is False
    ours.set("c1", "1")
    assert ours.check(["c1"]) is True
    assert ours.check(["c1", "c2"]) is False
    ours.add("c2", 1)
    assert ours.check(["c1", "c2"]) is True


# -- delete_key / num_keys / append / multi_* / list_keys -------------------------


def test_delete_key(ours: TCPStore) -> None:
    ours.set("doomed", "1")
    assert ours.delete_key("doomed") is True
    assert ours.delete_key("doomed") is False
    assert ours.check(["doomed"]) is False


def test_num_keys(master: TorchStore, ours: TCPStore) -> None:
    assert ours.num_keys() == 0
    ours.set("a", "1")
    ours.add("b", 1)
    master.append("c", "x")
    assert ours.num_keys() == master.num_keys() == 3
    assert ours.delete_key("a")
    assert ours.num_keys() == 2


def test_append(ours: TCPStore) -> None:
    ours.append("log", "a")
    ours.append("log", b"\x00bc")
    assert ours.get("log") == b"a\x00bc"


def test_multi_set_and_multi_get(ours: TCPStore, master: TorchStore) -> None:
    ours.multi_set(["m1", "m2", "m1"], ["one", "two", "uno"])
    assert ours.multi_get(["m2", "m1"]) == [b"two", b"uno"]
    assert master.multi_get(["m1", "m2"]) == [b"uno", b"two"]
    assert ours.multi_get([]) == []


def test_multi_get_waits_for_missing_keys(
    master: TorchStore, ours: TCPStore, pool: ThreadPoolExecutor
) -> None:
    master.set("x1", "1")
    pending = pool.submit(ours.multi_get, ["x1", "x2"])
    master.set("x2", "2")
    assert result(pending) == [b"1", b"2"]


def test_list_keys(ours: TCPStore, master: TorchStore) -> None:
    assert ours.list_keys() == []
    ours.set("a", "1")
    ours.add("b", 1)
    master.append("c", "1")
    ours.multi_set(["d/e"], ["1"])
    assert sorted(ours.list_keys()) == sorted(master.list_keys()) == ["a", "b", "c", "d/e"]


def test_keys_are_shared_with_torch_clients(ours: TCPStore, master: TorchStore) -> None:
    master.set("from_torch", "t")
    ours.set("from_ours", "o")
    assert ours.get("from_torch") == b"t"
    assert master.get("from_ours") == b"o"
    assert master.compare_set("from_ours", "o", "o2") == b"o2"
    assert ours.get("from_ours") == b"o2"


# -- barrier ---------------------------------------------------------------------


def test_barrier_with_torch_and_our_clients(master: TorchStore, pool: ThreadPoolExecutor) -> None:
    first, second = connect(master), connect(master)
    try:
        pending = [pool.submit(first.barrier, "b", 3), pool.submit(second.barrier, "b", 3)]
        master.barrier("b", 3)
        assert [result(p) for p in pending] == [None, None]
    finally:
        first.close()
        second.close()


def test_barrier_timeout(ours: TCPStore) -> None:
    with pytest.raises(StoreTimeoutError):
        ours.barrier("lonely", 2, SHORT)
    ours.set("after", "1")
    assert ours.get("after") == b"1"


# -- queues (libuv only) -----------------------------------------------------------


def test_queue_push_pop_len(ours_libuv: TCPStore, libuv_master: TorchStore) -> None:
    ours = ours_libuv
    assert ours.queue_len("q") == 0
    ours.queue_push("q", "first")
    libuv_master.queue_push("q", b"\x00second")
    assert ours.queue_len("q") == 2
    assert ours.queue_pop("q") == b"first"
    assert libuv_master.queue_len("q") == 1
    assert ours.queue_pop("q", block=False) == b"\x00second"
    assert ours.queue_len("q") == 0


def test_queue_pop_nonblocking_on_empty_raises(ours_libuv: TCPStore) -> None:
    with pytest.raises(QueueEmptyError):
        ours_libuv.queue_pop("empty", block=False)
    ours_libuv.queue_push("empty", "x")
    assert ours_libuv.queue_pop("empty", block=False) == b"x"


def test_queue_pop_blocks_until_a_push(
    ours_libuv: TCPStore, libuv_master: TorchStore, pool: ThreadPoolExecutor
) -> None:
    pending = pool.submit(ours_libuv.queue_pop, "jobs")
    assert libuv_master.queue_len("jobs") == 0
    libuv_master.queue_push("jobs", "a")
    assert result(pending) == b"a"


def test_queue_pop_blocking_times_out(ours_libuv: TCPStore) -> None:
    ours_libuv.set_timeout(SHORT)
    with pytest.raises(StoreTimeoutError):
        ours_libuv.queue_pop("never")
    ours_libuv.queue_push("never", "x")
    assert ours_libuv.queue_pop("never") == b"x"


# -- clone -----------------------------------------------------------------------


def test_clone_is_a_second_connection(ours: TCPStore, pool: ThreadPoolExecutor) -> None:
    other = ours.clone()
    try:
        pending = pool.submit(other.get, "k")
        ours.set("k", "v")
        assert result(pending) == b"v"
    finally:
        other.close()


# -- world_size / wait_for_workers -------------------------------------------------


@pytest.mark.parametrize("use_libuv", [True, False], ids=["libuv", "legacy"])
def test_torch_master_waits_for_our_workers(workers: WorkerPool, use_libuv: bool) -> None:
    (worker,) = workers.get(1)
    port = worker.listen()
    master, constructed = worker.store_async(
        listen_fd=True,
        host_name="127.0.0.1",
        port=port,
        world_size=3,
        is_master=True,
        wait_for_workers=True,
        use_libuv=use_libuv,
        timeout=CONNECT_TIMEOUT,
    )
    clients: list[TCPStore] = []
    try:
        clients.append(TCPStore("127.0.0.1", port, world_size=3, timeout=CONNECT_TIMEOUT))
        with pytest.raises(FutureTimeout):
            constructed.result(timeout=0.3)  # 2 of 3 joined: the master still waits
        clients.append(TCPStore("127.0.0.1", port, world_size=3, timeout=CONNECT_TIMEOUT))
        assert constructed.result(timeout=ANSWER_TIMEOUT) == port
        assert clients[0].num_keys() == 1  # init/
        assert clients[0].list_keys() == []
        master.set("go", "1")
        assert clients[1].get("go") == b"1"
    finally:
        for client in clients:
            client.close()


def test_wait_any_is_ours_only_and_the_connection_serves_on(ours: TCPStore) -> None:
    # A torch server knows no WAIT_ANY: the client says so without sending it
    # (the rendezvous then ticks to watch its steward, as without sessions).
    with pytest.raises(UnsupportedOperationError, match="not a tp-store server"):
        ours.wait_any(["outcome", "vacated"], 1)
    ours.set("outcome", "1")
    assert ours.get("outcome") == b"1"
