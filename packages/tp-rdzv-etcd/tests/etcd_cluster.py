"""Real etcd clusters for the tests: members on free loopback ports, data in temporary dirs.

A member counts as started once it logs that it serves client traffic (an
event read from its log, not a guess); a cluster, once every member did and
one of them reports a leader.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

BINARY_ENV = "TP_ETCD_BINARY"
#: Lines the tests want in the run's summary (the leader-kill timeline), even when passing.
SUMMARY: list[str] = []
# etcd 3.4 logs this (with --logger zap) once it has joined the cluster and serves.
_READY = "serving client traffic"


def find_etcd() -> str | None:
    """The etcd server binary: ``$TP_ETCD_BINARY``, ``etcd`` on PATH, or Debian's /usr/bin/etcd."""
    named = os.environ.get(BINARY_ENV)
    if named:
        return named if os.access(named, os.X_OK) else None
    found = shutil.which("etcd")
    if found:
        return found
    return "/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None


def etcd_version(binary: str) -> str:
    """What ``etcd --version`` says its version is."""
    output = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    for line in output.splitlines():
        if line.startswith("etcd Version:"):
            return line.split(":", 1)[1].strip()
    return output.strip()


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (free when asked)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class Member:
    """One etcd process."""

    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    proc: subprocess.Popen[str] | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    log: deque[str] = field(default_factory=lambda: deque(maxlen=200))

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self, binary: str, initial_cluster: str, token: str) -> None:
        self.proc = subprocess.Popen(
            [
                binary,
                "--name",
                self.name,
                "--data-dir",
                str(self.data_dir),
                "--listen-client-urls",
                self.client_url,
                "--advertise-client-urls",
                self.client_url,
                "--listen-peer-urls",
                self.peer_url,
                "--initial-advertise-peer-urls",
                self.peer_url,
                "--initial-cluster",
                initial_cluster,
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                token,
                # Elections within about a second: the leader-kill test waits for one.
                "--heartbeat-interval",
                "50",
                "--election-timeout",
                "500",
                "--logger",
                "zap",
                "--log-outputs",
                "stderr",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read_log, name=f"etcd-{self.name}-log", daemon=True).start()

    def _read_log(self) -> None:
        assert self.proc is not None
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip("\n"))
            if _READY in line:
                self.ready.set()
        self.ready.set()  # the process ended: nobody waits for a ready line in vain

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """``kill -9`` the member and reap it."""
        if self.proc is not None and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def status(self) -> dict[str, object]:
        """The member's ``/v3/maintenance/status``."""
        request = urllib.request.Request(
            self.client_url + "/v3/maintenance/status",
            data=b"{}",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            answer: dict[str, object] = json.loads(response.read())
            return answer


class Cluster:
    """``size`` etcd members on loopback, started together."""

    def __init__(self, binary: str, size: int, root: Path) -> None:
        ports = free_ports(2 * size)
        self.members = [
            Member(f"m{i}", ports[2 * i], ports[2 * i + 1], root / f"m{i}") for i in range(size)
        ]
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        self.on_stop: Callable[[], object] = lambda: None
        token = f"tp-{os.getpid()}-{ports[0]}"  # one per cluster: members check it
        for member in self.members:
            member.start(binary, initial, token)

    @property
    def endpoints(self) -> str:
        """The members' client URLs, comma-separated (the rendezvous endpoint)."""
        return ",".join(member.client_url for member in self.members)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for member in self.members:
            if not member.ready.wait(max(deadline - time.monotonic(), 0)) or not member.alive():
                raise RuntimeError(
                    f"etcd member {member.name} did not start:\n" + "\n".join(member.log)
                )

    def leader(self) -> Member:
        """The member that currently leads (asked of any live member)."""
        for member in self.members:
            if not member.alive():
                continue
            status = member.status()
            leader = str(status.get("leader"))
            for candidate in self.members:
                if candidate.alive():
                    header = candidate.status().get("header")
                    if isinstance(header, dict) and str(header.get("member_id")) == leader:
                        return candidate
        raise RuntimeError("no live etcd member reports a live leader")

    def stop(self) -> None:
        for member in self.members:
            member.kill()
        self.on_stop()


#: A fixture's way of starting a fresh cluster of a given size for one test.
MakeCluster = Callable[[int], Cluster]
