"""``tp-rdzv status`` and ``close --backend c10d`` on real torchrun jobs (PyTorch's own c10d).

Each test runs ``tp-rdzv store`` and torchrun agents (``--rdzv-backend=c10d``,
one worker each) on it; the workers print a line when they start and wait for
a store key to finish, so every step waits on an event: an agent's output
line, a key, a process exit.
"""

from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from interop_support import child_env

from tp_store import TCPStore

pytestmark = pytest.mark.interop

HERE = Path(__file__).resolve().parent
TP_RDZV = Path(sysconfig.get_path("scripts")) / "tp-rdzv"
#: Generous: torch takes seconds to import on a loaded 2-core machine.
BOUND = 180.0
RUN = "c10d-job"
RELEASE = f"release/{RUN}"


class Lines:
    """The lines of a child's stream, on a queue (read by a thread, never polled)."""

    def __init__(self, stream: IO[str]) -> None:
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)

    def _next(self, waiting_for: str) -> str | None:
        """The next line (``None`` at the end); fails after :data:`BOUND` s."""
        try:
            line = self._queue.get(timeout=BOUND)
        except queue.Empty:
            pytest.fail(f"no {waiting_for} within {BOUND} s")
        if line is not None:
            self.seen.append(line)
        return line

    def expect(self, pattern: str, what: str) -> re.Match[str]:
        """The first further line matching ``pattern``; fails after :data:`BOUND` s or at EOF."""
        compiled = re.compile(pattern)
        while (line := self._next(f"{what} line matching {pattern!r}")) is not None:
            if match := compiled.search(line):
                return match
        pytest.fail(f"{what} ended before a line matching {pattern!r}: {self.seen[-20:]}")

    def rest(self, what: str) -> str:
        """Everything the stream held, once it has ended (within :data:`BOUND` s)."""
        while self._next(f"end of {what}") is not None:
            pass
        return "".join(self.seen)


class Agent:
    """One torchrun agent with one c10d worker, output captured."""

    def __init__(self, endpoint: str, nnodes: str) -> None:
        host, port = endpoint.rsplit(":", 1)
        env = child_env()
        env["LOGLEVEL"] = "INFO"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nnodes={nnodes}",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={endpoint}",
                f"--rdzv-id={RUN}",
                "--rdzv-conf=is_host=false,keep_alive_interval=1,last_call_timeout=1,"
                "join_timeout=600",
                "--local-addr=127.0.0.1",
                "--monitor-interval=0.5",
                str(HERE / "c10d_worker.py"),
                host,
                port,
                RELEASE,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        self.stdout = Lines(self.process.stdout)
        self.stderr = Lines(self.process.stderr)

    def wait(self) -> int:
        return self.process.wait(timeout=BOUND)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@pytest.fixture
def store() -> Iterator[str]:
    """``tp-rdzv store`` on a free loopback port; its endpoint."""
    process = subprocess.Popen(
        [str(TP_RDZV), "store", "--host", "127.0.0.1", "--port", "0", "--json"],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert process.stdout is not None
    ready = json.loads(Lines(process.stdout).expect(r"listening", "tp-rdzv store").string)
    try:
        yield str(ready["endpoint"])
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    started: list[Agent] = []
    yield started
    for agent in started:
        agent.stop()


def tp_rdzv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TP_RDZV), *args],
        capture_output=True,
        text=True,
        timeout=BOUND,
        env=child_env(),
        check=False,
    )


def status(endpoint: str) -> dict[str, Any]:
    result = tp_rdzv(
        "status", "--backend", "c10d", "--endpoint", endpoint, "--run-id", RUN, "--json"
    )
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def client(endpoint: str) -> TCPStore:
    host, port = endpoint.rsplit(":", 1)
    return TCPStore(host, int(port), timeout=30)


def start_job(endpoint: str, agents: list[Agent]) -> list[Agent]:
    """Two agents of a 2-node job, their workers running."""
    pair = [Agent(endpoint, "2") for _ in range(2)]
    agents.extend(pair)
    ranks = {int(a.stdout.expect(r"worker-started rank=(\d+)", "agent")[1]) for a in pair}
    assert ranks == {0, 1}
    return pair


def finish_job(endpoint: str, pair: list[Agent]) -> None:
    """Release the workers; both agents must exit 0 without complaining about the state."""
    with client(endpoint) as store:
        store.set(RELEASE, "1")
    for agent in pair:
        agent.stdout.expect(r"worker-released", "agent")
        assert agent.wait() == 0, agent.stderr.seen[-20:]
        text = agent.stderr.rest("agent stderr")
        assert "corrupt" not in text, text[-2000:]
        assert "Traceback" not in text, text[-2000:]


def test_status_lists_the_participants_and_writes_nothing(store: str, agents: list[Agent]) -> None:
    pair = start_job(store, agents)
    with client(store) as observer:
        keys_before = sorted(observer.list_keys())
        count_before = observer.server_stats()["keys"]
        document = status(store)
        table = tp_rdzv("status", "--backend", "c10d", "--endpoint", store, "--run-id", RUN)
        assert sorted(observer.list_keys()) == keys_before
        assert observer.server_stats()["keys"] == count_before
    assert (document["backend"], document["round"]) == ("c10d", 0)
    assert document["complete"]
    assert not document["closed"]
    assert [node["rank"] for node in document["participants"]] == [0, 1]
    pids = sorted(str(agent.process.pid) for agent in pair)
    assert sorted(node["node"].split("_")[1] for node in document["participants"]) == pids
    assert all(node["node"].startswith("127.0.0.1_") for node in document["participants"])
    assert all(0 <= node["heartbeat_age"] < 60 for node in document["participants"])
    assert document["wait_list"] == []
    assert table.returncode == 0, table.stderr
    assert "participants (2)" in table.stdout
    finish_job(store, pair)


# The default backend (core) and PyTorch's name for it find the torchrun job's state alike.
@pytest.mark.parametrize("backend", [("--backend", "c10d"), ()], ids=["c10d", "default"])
def test_close_closes_the_job_and_its_agents_exit_cleanly(
    store: str, agents: list[Agent], backend: tuple[str, ...]
) -> None:
    pair = start_job(store, agents)
    closed = tp_rdzv("close", *backend, "--endpoint", store, "--run-id", RUN, "--json")
    assert closed.returncode == 0, closed.stderr
    assert json.loads(closed.stdout) == {"event": "closed", "run_id": RUN}
    assert status(store)["closed"]
    with client(store) as observer:
        assert not any(key.startswith("tp_rdzv/") for key in observer.list_keys())
    # PyTorch's nodes read the state we wrote as theirs: a new node is refused ...
    late = Agent(store, "1:3")
    agents.append(late)
    late.stderr.expect(r"RendezvousClosedError", "late agent")
    assert late.wait() != 0
    # ... and the running job ends normally, without reopening the rendezvous.
    finish_job(store, pair)
    assert status(store)["closed"]


def test_close_ends_an_agent_waiting_for_its_round(store: str, agents: list[Agent]) -> None:
    lone = Agent(store, "2")
    agents.append(lone)
    watch = subprocess.Popen(
        [
            *(str(TP_RDZV), "status", "--backend", "c10d", "--endpoint", store),
            *("--run-id", RUN, "--json", "--watch", "--interval", "0.2"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert watch.stdout is not None
        lines = Lines(watch.stdout)
        lines.expect(r'"participants": \[\{', "tp-rdzv status --watch")
    finally:
        watch.kill()
        watch.wait()
    closed = tp_rdzv("close", "--backend", "c10d", "--endpoint", store, "--run-id", RUN)
    assert closed.returncode == 0, closed.stderr
    # PyTorch's own answer to a closed rendezvous: the waiting agent stops at once.
    lone.stderr.expect(r"RendezvousClosedError", "waiting agent")
    assert lone.wait() != 0
