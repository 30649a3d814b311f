"""Store sessions and PyTorch's client on our server.

PyTorch's client sees the sessions' keys as ordinary keys, and a will pushed
when a session ends wakes it in ``wait`` like any write. (Our client's
``open_session`` on a PyTorch server: ``test_server_stats_interop.py``.)
"""

from __future__ import annotations

import time

import pytest
from interop_support import ANSWER_TIMEOUT, STORE_TIMEOUT, OurServer, WorkerPool

from tp_store import TCPStore

pytestmark = pytest.mark.interop


def test_torch_s_client_sees_session_keys_and_is_woken_by_a_will(
    our_server: OurServer, workers: WorkerPool
) -> None:
    ours = TCPStore(our_server.host, our_server.port, timeout=STORE_TIMEOUT)
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
    ours.close()
