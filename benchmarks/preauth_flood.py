"""A client with the secret, against a store under attack by clients without it.

A ``python -m tp_store`` server with a secret and ``--max-connections`` set to
just the attackers' number plus one: ``--floods`` processes that connect and
pipeline PINGs as fast as they can without authenticating (reconnecting each
time they are dropped), and ``--stalled`` connections that send VALIDATE and
PINGs into a small receive window and never read (reconnecting too). Then a
:class:`~tp_store.TCPStore` with the secret connects (retrying while the
server is full) and times ``--gets`` GETs; the same is measured with no
attackers first, for the ratio::

    python benchmarks/preauth_flood.py [--floods 4] [--stalled 31] [--gets 2000] [--json]

The goal is a median GET under 5 ms under attack; the figures are printed,
never asserted here (``tests/test_preauth_flood.py`` runs it briefly and checks
that the client connects and is served).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

try:
    import tp_store
except ImportError:  # run from a checkout without installing: use the monorepo's source
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "tp-store" / "src"))
    import tp_store

from tp_store import StoreConnectionError, TCPStore
from tp_store.protocol import Ping, Validate

SECRET = b"the benchmark's secret, 32 bytes"
TIMEOUT = 60.0
_PING = Ping(1).encode()


@contextmanager
def secret_server(max_connections: int) -> Iterator[int]:
    """``python -m tp_store`` with :data:`SECRET` on a free port; yields the port."""
    env = dict(os.environ)
    src = str(Path(next(iter(tp_store.__path__))).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory() as directory:
        secret_file = Path(directory) / "secret"
        secret_file.write_bytes(SECRET)
        secret_file.chmod(0o600)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tp_store",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--secret-file",
                str(secret_file),
                "--max-connections",
                str(max_connections),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # it logs each dropped attacker (throttled)
            text=True,
            env=env,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            match = re.fullmatch(r"listening on 127\.0\.0\.1:(\d+)", line)
            if match is None:
                raise RuntimeError(f"the server printed {line!r}")
            yield int(match[1])
        finally:
            proc.terminate()
            proc.wait(TIMEOUT)


def _flood(port: int, stop: Any) -> None:
    """Connect and pipeline PINGs without authenticating, again whenever dropped."""
    burst = Validate().encode() + _PING * 4096
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
                while not stop.is_set():
                    sock.sendall(burst)
        except OSError:
            continue


def _stall(port: int, count: int, stop: Any) -> None:
    """``count`` connections that send the handshake and PINGs and never read."""
    burst = Validate().encode() + _PING * 4096

    def connect() -> socket.socket | None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(0.2)
        try:
            sock.connect(("127.0.0.1", port))
            with suppress(OSError):
                sock.sendall(burst)
        except OSError:
            sock.close()
            return None
        return sock

    sockets: list[socket.socket | None] = [None] * count
    while not stop.is_set():
        for index, sock in enumerate(sockets):
            if sock is not None:
                try:  # a peek, not a read: is it still open?
                    sock.setblocking(False)
                    closed = sock.recv(1, socket.MSG_PEEK) == b""
                except BlockingIOError:
                    closed = False
                except OSError:
                    closed = True
                if not closed:
                    continue
                sock.close()
            sockets[index] = connect()
        stop.wait(0.05)
    for sock in sockets:
        if sock is not None:
            sock.close()


def connect(port: int) -> tuple[TCPStore, float]:
    """Our client with the secret, retrying while the server is full; and seconds it took."""
    began = time.perf_counter()
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            return TCPStore("127.0.0.1", port, timeout=TIMEOUT, secret=SECRET), (
                time.perf_counter() - began
            )
        except StoreConnectionError as exc:
            if "connection limit" not in str(exc) or time.monotonic() > deadline:
                raise


def time_gets(port: int, gets: int) -> dict[str, float]:
    """Connect and time ``gets`` GETs of a small value: seconds for each figure."""
    store, connect_s = connect(port)
    try:
        store.set("key", "x" * 64)
        latencies = []
        for _ in range(gets):
            began = time.perf_counter()
            store.get("key")
            latencies.append(time.perf_counter() - began)
    finally:
        store.close()
    latencies.sort()
    return {
        "connect_s": connect_s,
        "gets": len(latencies),
        "median_s": statistics.median(latencies),
        "p99_s": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "max_s": latencies[-1],
    }


def run(floods: int, stalled: int, gets: int) -> dict[str, Any]:
    """Both measurements (alone, under attack) and the attack's shape."""
    context = multiprocessing.get_context("spawn")
    with secret_server(max_connections=floods + stalled + 1) as port:
        alone = time_gets(port, gets)
        stop = context.Event()
        attackers = [context.Process(target=_flood, args=(port, stop)) for _ in range(floods)]
        attackers.append(context.Process(target=_stall, args=(port, stalled, stop)))
        for process in attackers:
            process.start()
        try:
            time.sleep(2.0)  # let the attack reach its steady state: every place taken
            attacked = time_gets(port, gets)
        finally:
            stop.set()
            for process in attackers:
                process.join(TIMEOUT)
                if process.is_alive():
                    process.kill()
    return {
        "floods": floods,
        "stalled": stalled,
        "max_connections": floods + stalled + 1,
        "alone": alone,
        "attacked": attacked,
        "median_ratio": attacked["median_s"] / alone["median_s"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--floods", type=int, default=4, help="unauthenticated PING floods")
    parser.add_argument("--stalled", type=int, default=31, help="non-reading pre-auth clients")
    parser.add_argument("--gets", type=int, default=2000, help="GETs timed per measurement")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    result = run(args.floods, args.stalled, args.gets)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{args.floods} unauthenticated floods + {args.stalled} non-reading pre-auth clients, "
        f"max_connections {result['max_connections']}; {args.gets} GETs each"
    )
    for name in ("alone", "attacked"):
        figures = result[name]
        print(
            f"  {name:9s} connect {figures['connect_s'] * 1e3:8.1f} ms  "
            f"median {figures['median_s'] * 1e3:6.3f} ms  p99 {figures['p99_s'] * 1e3:7.3f} ms  "
            f"max {figures['max_s'] * 1e3:8.3f} ms"
        )
    print(f"  median under attack / alone: {result['median_ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
