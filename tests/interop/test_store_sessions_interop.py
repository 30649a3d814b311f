"""Store sessions and PyTorch: our client on torch's servers, torch's client on ours.

A PyTorch server does not accept the protocol extensions, so our client's
``open_session`` refuses at once and sends nothing (an unknown opcode would
make the server drop the connection). On our server, PyTorch's client sees
the sessions' keys as ordinary keys, and a will pushed when a session ends
wakes it in ``wait`` like any write.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from interop_support import ANSWER_TIMEOUT, STORE_TIMEOUT, OurServer, TorchStore, WorkerPool

from tp_store import PrefixStore, TCPStore, UnsupportedOperationError

pytestmark = pytest.mark.interop

#: Store timeout of connections to a torch server (see test_our_client_torch_server.py).
CONNECT_TIMEOUT = 20.0


@pytest.mark.parametrize("use_libuv", [True, False], ids=["libuv", "legacy"])
def test_a_session_on_a_torch_server_is_refused_at_once(
    workers: WorkerPool, use_libuv: bool
) -> None:
    (worker,) = workers.get(1)
    master: TorchStore = worker.store(
        host_name="127.0.0.1",
        port=0,
        is_master=True,
        use_libuv=use_libuv,
        timeout=CONNECT_TIMEOUT,
    )
    store = TCPStore("127.0.0.1", master.port, timeout=CONNECT_TIMEOUT)
    try:
        message = (
            f"the server at 127.0.0.1:{master.port} does not offer store sessions "
            r"\(not a tp-store server\)"
        )
        with pytest.raises(UnsupportedOperationError, match=message):
            store.open_session(5)
        with pytest.raises(UnsupportedOperationError, match=message):
            PrefixStore("job", store).open_session(5)
        # Nothing was sent: the connection still works, for torch's client too.
        store.set("after", "1")
        assert store.get("after") == b"1"
        assert master.get("after") == b"1"
    finally:
        store.close()


@pytest.fixture
def ours(our_server: OurServer) -> Iterator[TCPStore]:
    store = TCPStore(our_server.host, our_server.port, timeout=STORE_TIMEOUT)
    try:
        yield store
    finally:
        store.close()


def test_torch_s_client_sees_session_keys_and_is_woken_by_a_will(
    our_server: OurServer, workers: WorkerPool, ours: TCPStore
) -> None:
    (worker,) = workers.get(1)
    torch_client = worker.store(host_name=our_server.host, port=our_server.port)
    session = ours.open_session(60)
    session.set("present/ours", "here")
    session.add_will("departures", "ours gone")
    assert torch_client.get("present/ours") == b"here"
    torch_client.set("ordinary", "1")
    waiting = torch_client.submit("wait", ["departures"])
    deadline = time.monotonic() + ANSWER_TIMEOUT
    while ours.server_stats()["waiters_parked"] != 1:  # torch's wait is parked
        assert time.monotonic() < deadline, "torch's wait never parked"
        time.sleep(0.005)
    session.close()
    assert waiting.result(timeout=ANSWER_TIMEOUT) is None
    assert not torch_client.check(["present/ours"])
    assert torch_client.get("ordinary") == b"1"
    assert ours.queue_pop("departures", block=False) == b"ours gone"
