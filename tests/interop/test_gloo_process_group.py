"""Four PyTorch processes form a gloo process group through our server."""

from __future__ import annotations

import pytest
from interop_support import ANSWER_TIMEOUT, OurServer, WorkerPool

pytestmark = pytest.mark.interop

WORLD_SIZE = 4


def test_gloo_all_reduce_over_our_store(our_server: OurServer, workers: WorkerPool) -> None:
    pending = [
        worker.submit(
            "allreduce",
            kwargs={
                "host": our_server.host,
                "port": our_server.port,
                "rank": rank,
                "world_size": WORLD_SIZE,
                "timeout": 15.0,
            },
        )
        for rank, worker in enumerate(workers.get(WORLD_SIZE))
    ]
    # every rank sees the sum of the ranks 0 + 1 + 2 + 3
    assert [p.result(timeout=ANSWER_TIMEOUT) for p in pending] == [6] * WORLD_SIZE
    our_server.assert_alive()
