"""torchrun on our rendezvous (``--rdzv-backend=tp``): a node dies, the other resumes.

Two torchrun agents of 2 workers each (``--nnodes=1:2``) train a small DDP
model on gloo, on ``tp-rdzv store``; one node (agent and workers) is killed
with SIGKILL once both train. The survivor must resume at its first restart
(``TORCHELASTIC_RESTART_COUNT`` 1) with its 2 workers, train, and exit 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from torchrun_job import FAST_FAILOVER, WORKERS_PER_NODE, ElasticJob, start_store

pytestmark = pytest.mark.interop

#: Bounds for a loaded 2-core machine: torch's imports alone take seconds there.
START_TIMEOUT = 240.0
RESUME_TIMEOUT = 240.0


@pytest.fixture
def store_endpoint(tmp_path: Path) -> Iterator[str]:
    with (tmp_path / "store.log").open("w") as log:
        proc, endpoint = start_store(log)
        try:
            yield endpoint
        finally:
            proc.terminate()
            proc.wait(30)


@pytest.mark.parametrize("killed_group_rank", [0, 1])
def test_the_survivor_resumes_at_its_first_restart(
    tmp_path: Path, store_endpoint: str, killed_group_rank: int
) -> None:
    job = ElasticJob(tmp_path, "tp", store_endpoint, f"{FAST_FAILOVER},join_timeout=300")
    try:
        job.start()
        trained = job.wait_until_training(START_TIMEOUT)
        victim = next(
            job.node_of(report["agent_pid"])
            for report in trained.values()
            if report["group_rank"] == killed_group_rank
        )
        (survivor,) = (node for node in job.nodes if node is not victim)
        job.kill(victim)

        ranks = range(WORKERS_PER_NODE)
        resumed = job.wait_for([f"done-a1-r{rank}" for rank in ranks], RESUME_TIMEOUT)
        assert job.wait_exit(survivor, RESUME_TIMEOUT) == 0, job.logs()
        # The survivor's own workers, alone now: group rank 0 of a world of 2.
        assert {report["agent_pid"] for report in resumed.values()} == {survivor.proc.pid}
        assert {report["group_rank"] for report in resumed.values()} == {0}
        assert not list(job.markers.glob("*-a2-*")), "the first restart failed"
    finally:
        job.close()
