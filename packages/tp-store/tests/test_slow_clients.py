"""Slow clients do not slow anyone else: latency of normal clients with and without them.

The server is a ``python -m tp_store`` child process (so that it does not share
a GIL with the clients). Normal clients (our ``TCPStore``, one thread each)
time set and get calls, first alone, then with slow clients attached:

- tricklers: connections that send a request one byte per second;
- flooders: connections that pipeline GETs of a 1 MiB value and never read
  a reply (the server stops reading them once their replies back up).

The figures are printed for the record; the assertion is deliberately loose
(timing goals belong in benchmarks): the p99 latency with slow clients stays
within ten times the p99 without them, or 50 ms, whichever is larger. The
server's resident memory is printed and bounded too.
"""

from __future__ import annotations

import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tp_store
from tp_store import TCPStore
from tp_store.protocol import Get, Set, Validate

NORMAL_CLIENTS = 4
OPS_PER_CLIENT = 400
TRICKLERS = 20
FLOODERS = 4
BIG_VALUE = b"v" * (1 << 20)
TIMEOUT = 30.0


class ChildServer:
    """``python -m tp_store`` on a free port."""

    def __init__(self) -> None:
        env = dict(os.environ)
        src = str(Path(next(iter(tp_store.__path__))).resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tp_store", "--host", "127.0.0.1", "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        match = re.fullmatch(r"listening on 127\.0\.0\.1:(\d+)", line)
        if match is None:
            self.stop()
            pytest.fail(f"the server printed {line!r}")
        self.port = int(match[1])

    def rss_mib(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        assert found is not None
        return int(found[1]) / 1024

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def server() -> Iterator[ChildServer]:
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc to read the server's memory")
    child = ChildServer()
    yield child
    child.stop()


def measure(port: int) -> list[float]:
    """Latencies (seconds) of set and get calls of ``NORMAL_CLIENTS`` concurrent clients."""
    stores = [TCPStore("127.0.0.1", port, timeout=TIMEOUT) for _ in range(NORMAL_CLIENTS)]
    latencies: list[list[float]] = [[] for _ in stores]
    start = threading.Barrier(len(stores))

    def work(index: int) -> None:
        store = stores[index]
        own = latencies[index]
        start.wait()
        for op in range(OPS_PER_CLIENT):
            key = f"client{index}/{op // 2 % 16}"  # a get reads the key just set
            began = time.perf_counter()
            if op % 2:
                store.get(key)
            else:
                store.set(key, "x" * 64)
            own.append(time.perf_counter() - began)

    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            work(index)
        except BaseException as exc:
            errors.append(exc)
            start.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for store in stores:
        store.close()
    assert not errors, errors
    return [latency for own in latencies for latency in own]


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class SlowClients:
    """Tricklers and flooders, attached until :meth:`detach`."""

    def __init__(self, port: int) -> None:
        self.stop = threading.Event()
        self.sockets: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        setter = TCPStore("127.0.0.1", port, timeout=TIMEOUT)
        setter.set("big", BIG_VALUE)
        setter.close()
        tricklers = [self._connect(port) for _ in range(TRICKLERS)]
        self._start(self._trickle, tricklers)
        self.blocked = threading.Barrier(FLOODERS + 1)
        for _ in range(FLOODERS):
            self._start(self._flood, self._connect(port))

    def _connect(self, port: int) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        sock.sendall(Validate().encode())
        self.sockets.append(sock)
        return sock

    def _start(self, target: object, argument: object) -> None:
        thread = threading.Thread(target=target, args=(argument,), daemon=True)  # type: ignore[arg-type]
        thread.start()
        self.threads.append(thread)

    def _trickle(self, sockets: list[socket.socket]) -> None:
        frame = Set(b"/trickled", b"t" * 1000).encode()
        for byte in frame:
            for sock in sockets:
                try:
                    sock.sendall(bytes((byte,)))
                except OSError:
                    return
            if self.stop.wait(1.0):
                return

    def _flood(self, sock: socket.socket) -> None:
        requests = Get(b"/big").encode() * 1024
        sock.settimeout(0.5)
        reported = False
        while not self.stop.is_set():
            try:
                sock.sendall(requests)
            except TimeoutError:
                # The server stopped reading us: our replies back up unread.
                if not reported:
                    reported = True
                    self.blocked.wait()
            except OSError:
                return

    def detach(self) -> None:
        self.stop.set()
        for sock in self.sockets:
            sock.close()
        for thread in self.threads:
            thread.join()


def test_slow_clients_do_not_slow_the_others(
    server: ChildServer, capsys: pytest.CaptureFixture[str]
) -> None:
    measure(server.port)  # warm-up: connections, code paths
    alone = measure(server.port)
    rss_alone = server.rss_mib()
    slow = SlowClients(server.port)
    try:
        slow.blocked.wait(timeout=TIMEOUT)  # every flooder is held back by the server
        rss_slow = server.rss_mib()
        crowded = measure(server.port)
        rss_after = server.rss_mib()
    finally:
        slow.detach()
    figures = {
        "alone": (percentile(alone, 0.5), percentile(alone, 0.99), statistics.fmean(alone)),
        "with slow clients": (
            percentile(crowded, 0.5),
            percentile(crowded, 0.99),
            statistics.fmean(crowded),
        ),
    }
    with capsys.disabled():
        print(
            f"\n{NORMAL_CLIENTS} clients x {OPS_PER_CLIENT} set/get; slow clients: "
            f"{TRICKLERS} tricklers (1 byte/s), {FLOODERS} never-reading flooders (GET 1 MiB)"
        )
        for name, (p50, p99, mean) in figures.items():
            print(
                f"  {name:18s} p50 {p50 * 1e3:6.2f} ms  p99 {p99 * 1e3:6.2f} ms  "
                f"mean {mean * 1e3:6.2f} ms"
            )
        print(
            f"  server RSS: {rss_alone:.1f} MiB alone, {rss_slow:.1f} MiB with slow clients, "
            f"{rss_after:.1f} MiB after the crowded run"
        )
    p99_alone = figures["alone"][1]
    p99_crowded = figures["with slow clients"][1]
    assert p99_crowded < max(10 * p99_alone, 0.050), figures
    # Flooders hold about one 1 MiB reply each; 4 GiB of replies were asked for.
    assert rss_after - rss_alone < 64, (rss_alone, rss_after)
