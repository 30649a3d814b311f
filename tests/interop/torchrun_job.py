"""An elastic torchrun job of two nodes on one machine, and one node killed mid-training.

Used by ``test_torchrun_restart.py`` and by ``benchmarks/restart_bench.py``.
The store is ``tp-rdzv store`` on loopback; each node is a ``torchrun
--nnodes=1:2 --nproc-per-node=2`` agent (in a session of its own) running
``elastic_train.py``, whose workers report through marker files. Everything
is awaited on those files or on process exits, with generous bounds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tp_store import TCPStore

HERE = Path(__file__).resolve().parent
TRAIN_SCRIPT = HERE / "elastic_train.py"
#: The rendezvous settings of the restart figure (and of the test).
FAST_FAILOVER = "keep_alive_interval=1,keep_alive_max_attempt=2,last_call_timeout=1"
#: torchrun's --rdzv-conf for both: FAST_FAILOVER, and time for a loaded machine to start.
RDZV_CONF = f"{FAST_FAILOVER},join_timeout=300"
#: How an agent is started: torchrun (the benchmark may wrap it).
TORCHRUN = (sys.executable, "-m", "torch.distributed.run")
NODES = 2
WORKERS_PER_NODE = 2
#: Steps of each attempt.
STEPS = 5
#: How often the marker directory is looked at while waiting.
_POLL = 0.05
#: The bound of one read of the job's store (the lease exists once the job trains).
_STORE_TIMEOUT = 60.0


def child_env() -> dict[str, str]:
    """The environment of agents: LOGLEVEL makes torch's agent log its rendezvous and
    restarts (shown when a test fails)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", LOGLEVEL="INFO")
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    return env


class JobError(AssertionError):
    """The job did not do what was awaited; the message carries the agents' logs."""


def start_store(log: IO[str]) -> tuple[subprocess.Popen[str], str]:
    """``tp-rdzv store`` on a free loopback port, and its endpoint once it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tp_rdzv_cli", "store", "--host", "127.0.0.1", "--port=0", "--json"],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # printed once listening; EOF if it died
    try:
        return proc, str(json.loads(line)["endpoint"])
    except (ValueError, KeyError) as exc:
        proc.kill()
        proc.wait()
        raise JobError(f"tp-rdzv store printed {line!r}") from exc


@dataclass
class Node:
    """One torchrun agent (the leader of its own process group) and its log."""

    proc: subprocess.Popen[bytes]
    log: Path
    killed: bool = False


class ElasticJob:
    """Two torchrun agents of one run on ``backend`` at ``endpoint``.

    ``rdzv_conf`` is torchrun's ``--rdzv-conf``; ``directory`` holds the
    markers and the logs. ``launcher`` starts an agent (its arguments follow);
    ``env`` is added to the agents' environment.
    """

    def __init__(
        self,
        directory: Path,
        backend: str,
        endpoint: str,
        rdzv_conf: str,
        *,
        launcher: Sequence[str] = TORCHRUN,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.markers = directory / "markers"
        self.markers.mkdir(parents=True)
        self._logs = directory
        self._env = dict(env or {})
        self._endpoint = endpoint
        self.run_id = f"job-{uuid.uuid4().hex[:8]}"
        self._command = [
            *launcher,
            f"--nnodes=1:{NODES}",
            f"--nproc-per-node={WORKERS_PER_NODE}",
            "--max-restarts=3",
            "--monitor-interval=0.1",
            f"--rdzv-backend={backend}",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={self.run_id}",
            f"--rdzv-conf={rdzv_conf}",
            "--local-addr=127.0.0.1",
            str(TRAIN_SCRIPT),
            str(self.markers),
            str(STEPS),
        ]
        self.nodes: list[Node] = []

    def start(self) -> None:
        env = child_env() | self._env
        for index in range(NODES):
            log = self._logs / f"agent{index}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    self._command,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            self.nodes.append(Node(proc, log))

    def wait_for(self, names: list[str], timeout: float) -> dict[str, dict[str, Any]]:
        """The content of the markers ``names``, once all exist."""
        deadline = time.monotonic() + timeout
        while True:
            found = {name: self.markers / name for name in names}
            if all(path.exists() for path in found.values()):
                return {name: json.loads(path.read_text()) for name, path in found.items()}
            if time.monotonic() > deadline:
                missing = sorted(name for name, path in found.items() if not path.exists())
                raise JobError(f"markers {missing} not written within {timeout} s{self.logs()}")
            for node in self.nodes:
                if not node.killed and node.proc.poll() is not None:
                    raise JobError(
                        f"agent {node.proc.pid} exited with {node.proc.returncode} while "
                        f"waiting for {names}{self.logs()}"
                    )
            time.sleep(_POLL)

    def wait_until_training(self, timeout: float) -> dict[str, dict[str, Any]]:
        """Both nodes trained attempt 0 together (world 4); which worker is whose."""
        world = NODES * WORKERS_PER_NODE
        return self.wait_for([f"trained-a0-w{world}-r{rank}" for rank in range(world)], timeout)

    def kill_group_rank(self, group_rank: int, timeout: float) -> tuple[Node, float]:
        """Once both nodes train, SIGKILL the one of ``group_rank``; the survivor and the
        wall-clock time of the kill."""
        return self.kill_node(self.node_of_group_rank(group_rank, timeout))

    def kill_steward(self, timeout: float) -> tuple[Node, float]:
        """Once both nodes train, SIGKILL the one whose agent holds the steward lease
        (backend ``tp``); the survivor and the wall-clock time of the kill."""
        self.wait_until_training(timeout)
        return self.kill_node(self.node_of(self.steward_pid()))

    def node_of_group_rank(self, group_rank: int, timeout: float) -> Node:
        """Once both nodes train, the node of ``group_rank``."""
        trained = self.wait_until_training(timeout)
        return next(
            self.node_of(report["agent_pid"])
            for report in trained.values()
            if report["group_rank"] == group_rank
        )

    def steward_pid(self) -> int:
        """The pid of the agent holding the steward lease (backend ``tp``), from the store.

        The lease key ``tp_rdzv/<run>/steward`` holds ``"<epoch> <node> <beat>
        <round>"`` and a node's key is ``<addr>_<pid>_<local id>``
        (docs/design/dynamic-rendezvous.md); under torchrun a node is its agent.
        """
        host, port = self._endpoint.rsplit(":", 1)
        store = TCPStore(host, int(port), timeout=_STORE_TIMEOUT)
        try:
            lease = store.get(f"tp_rdzv/{self.run_id}/steward").decode()
        finally:
            store.close()
        fields = lease.split(" ")
        holder = fields[1] if len(fields) > 1 else "-"
        if holder == "-":
            raise JobError(f"no steward holds the lease: {lease!r}{self.logs()}")
        return int(holder.rsplit("_", 2)[1])

    def kill_node(self, victim: Node) -> tuple[Node, float]:
        """SIGKILL ``victim``; the survivor and the wall-clock time of the kill."""
        (survivor,) = (node for node in self.nodes if node is not victim)
        return survivor, self.kill(victim)

    def node_of(self, agent_pid: int) -> Node:
        for node in self.nodes:
            if node.proc.pid == agent_pid:
                return node
        raise JobError(f"no agent of ours has pid {agent_pid}{self.logs()}")

    def kill(self, node: Node) -> float:
        """SIGKILL the node: its agent's process group and its workers (each the leader
        of a session of its own); the wall-clock time of the kill."""
        node.killed = True
        killed_at = time.time()
        kill_agent(node.proc)
        return killed_at

    def wait_exit(self, node: Node, timeout: float) -> int:
        try:
            return node.proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise JobError(
                f"agent {node.proc.pid} still runs after {timeout} s{self.logs()}"
            ) from exc

    def logs(self) -> str:
        parts = [
            f"\n--- agent {n.proc.pid} ({n.log.name}) ---\n{n.log.read_text()[-6000:]}"
            for n in self.nodes
        ]
        return "".join(parts)

    def close(self) -> None:
        """Kill whatever of the job still runs."""
        for node in self.nodes:
            if node.proc.poll() is None:
                self.kill(node)


def kill_agent(agent: subprocess.Popen[Any]) -> None:
    """SIGKILL an agent started in a session of its own, and its workers (PyTorch starts
    each in a session of its own too); wait for the agent."""
    with contextlib.suppress(ProcessLookupError):  # it has exited and been reaped
        # Stopped first, the agent starts no worker between the listing and the kill.
        os.killpg(agent.pid, signal.SIGSTOP)
        workers = _children(agent.pid)
        os.killpg(agent.pid, signal.SIGKILL)
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker, signal.SIGKILL)
    agent.wait()


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from Linux's /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (name) state ppid ...": the name may hold spaces and parentheses.
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process is gone
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found
