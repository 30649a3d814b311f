#!/usr/bin/env python3
"""What hostile clients of the workers' bootstrap store cost the agent hosting it.

The agent is this process; its bootstrap store runs where the agent runs it:

- **child**: as now, in the agent's child process (``BootstrapProcess``);
- **in-process**: as before issue 28, a store server thread in the agent's
  own interpreter (``TCPStore(is_master=True)``), for comparison.

Two probes, each side by side on both placements:

- **PING flood**: ``--floods`` processes (one connection each, no secret: the
  bootstrap store has none) pipeline PINGs and read the answers for
  ``--seconds``; meanwhile a thread of the agent sleeps 50 ms in a loop, as its
  keep-alive does, and records how late each wake-up is (median, p99, max),
  against the same timer on a quiet store first.
- **Store all it can**: a client process stores 8 MiB values (reconnecting
  whenever it is dropped) until ``--fill-seconds`` pass or it has stored
  ``--fill-values``; the agent's RSS before and after, the child's RSS, and
  whether ``--workers`` workers (our clients, each its own connection) then
  complete the handshake of a process group: ``add`` a counter, the last one
  sets a key, every one ``get``s it.

    python benchmarks/bootstrap_probes.py            # 4 floods for 10 s; 100 values of 8 MiB

Every process it starts is ended before it exits, also on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tp_rdzv_dynamic.node.bootstrap_process import BootstrapProcess
from tp_store import StoreError, TCPStore
from tp_store.protocol import Ping, Set, Validate

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "bootstrap_probes.json"
TIMER_SECONDS = 0.05
VALUE_BYTES = 8 * 1024 * 1024
_PINGS = Ping(1).encode() * 256


# -- the hostile clients (processes of their own) ------------------------------------------
def flood(port: int, seconds: float) -> None:
    """Pipeline PINGs on one connection, reading the answers, for ``seconds``."""
    deadline = time.monotonic() + seconds
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(Validate().encode())
        while time.monotonic() < deadline:
            sock.sendall(_PINGS)
            expected = 4 * 256
            while expected > 0:
                got = sock.recv(65536)
                if not got:
                    return
                expected -= len(got)


def fill(port: int, values: int, seconds: float) -> None:
    """Store ``values`` values of 8 MiB (new keys), reconnecting when dropped; print how
    many the store took."""
    deadline = time.monotonic() + seconds
    stored = refusals = 0
    value = b"x" * VALUE_BYTES
    while stored < values and time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                sock.sendall(Validate().encode())
                while stored < values and time.monotonic() < deadline:
                    sock.sendall(Set(f"fill{stored}/{refusals}".encode(), value).encode())
                    sock.sendall(Ping(1).encode())  # answered once the SET was applied
                    if len(sock.recv(4)) < 4:
                        raise ConnectionResetError
                    stored += 1
        except OSError:
            refusals += 1
            if refusals > 100:
                break
    print(json.dumps({"stored": stored, "refusals": refusals}), flush=True)


# -- the agent's side --------------------------------------------------------------
def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


@contextlib.contextmanager
def bootstrap_store(placement: str) -> Iterator[tuple[int, int | None]]:
    """The port of an empty bootstrap store placed as ``placement``, and its child's pid."""
    if placement == "child":
        process = BootstrapProcess()
        try:
            yield process.host("127.0.0.1"), process.pid
        finally:
            process.stop()
    else:
        master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=60)
        try:
            yield master.port, None
        finally:
            master.close()


def timer_lateness(seconds: float) -> list[float]:
    """How late (s) each 50 ms sleep of a thread of this process woke, for ``seconds``."""
    late: list[float] = []

    def tick() -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            before = time.monotonic()
            time.sleep(TIMER_SECONDS)
            late.append(time.monotonic() - before - TIMER_SECONDS)

    thread = threading.Thread(target=tick)
    thread.start()
    thread.join()
    return late


def summary(late: list[float]) -> dict[str, float]:
    ordered = sorted(late)
    return {
        "median_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * ordered[int(0.99 * (len(ordered) - 1))],
        "max_ms": 1000 * ordered[-1],
    }


def helper(*args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, *map(str, args)], stdout=subprocess.PIPE, text=True
    )


def end(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def ping_flood(placement: str, floods: int, seconds: float) -> dict[str, Any]:
    with bootstrap_store(placement) as (port, _):
        quiet = summary(timer_lateness(min(seconds, 3.0)))
        procs = [helper("--flood", port, seconds + 1) for _ in range(floods)]
        try:
            time.sleep(0.5)  # the flooders connect
            flooded = summary(timer_lateness(seconds))
        finally:
            end(procs)
    return {"quiet": quiet, "flooded": flooded, "load": os.getloadavg()[0]}


def handshake(port: int, workers: int) -> str | None:
    """``workers`` clients do a process group's store handshake; None, or the first error."""
    errors: list[str] = []

    def worker() -> None:
        try:
            store = TCPStore("127.0.0.1", port, timeout=30)
            if store.add("workers", 1) == workers:
                store.set("unique_id", b"u" * 128)
            store.get("unique_id")
            store.close()
        except StoreError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors[0] if errors else None


def store_all(placement: str, values: int, seconds: float, workers: int) -> dict[str, Any]:
    with bootstrap_store(placement) as (port, child):
        agent_before = rss_mib(os.getpid())
        child_before = rss_mib(child) if child else None
        proc = helper("--fill", port, values, seconds)
        try:
            assert proc.stdout is not None
            filled = json.loads(proc.stdout.readline())
        finally:
            end([proc])
        child_growth = rss_mib(child) - child_before if child and child_before else None
        return {
            "stored_values": filled["stored"],
            "dropped": filled["refusals"],
            "agent_rss_before_mib": agent_before,
            "agent_rss_growth_mib": rss_mib(os.getpid()) - agent_before,
            "child_rss_growth_mib": child_growth,
            "workers_error": handshake(port, workers),
            "load": os.getloadavg()[0],
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flood", nargs=2, type=float, help=argparse.SUPPRESS)
    parser.add_argument("--fill", nargs=3, type=float, help=argparse.SUPPRESS)
    parser.add_argument("--floods", type=int, default=4, help="flooding connections (4)")
    parser.add_argument("--seconds", type=float, default=10.0, help="the flood's length (10)")
    parser.add_argument("--fill-values", type=int, default=100, help="8 MiB values at most (100)")
    parser.add_argument("--fill-seconds", type=float, default=60.0, help="the fill's bound (60)")
    parser.add_argument("--workers", type=int, default=64, help="workers after the fill (64)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON results")
    args = parser.parse_args(argv)
    if args.flood:
        flood(int(args.flood[0]), args.flood[1])
        return 0
    if args.fill:
        fill(int(args.fill[0]), int(args.fill[1]), args.fill[2])
        return 0
    sys.path.insert(0, str(HERE))
    from hostinfo import host_info, versions

    host = host_info()
    results: dict[str, Any] = {}
    for placement in ("child", "in-process"):
        results[placement] = {
            "ping_flood": ping_flood(placement, args.floods, args.seconds),
            "store_all": store_all(placement, args.fill_values, args.fill_seconds, args.workers),
        }
        print(placement, json.dumps(results[placement], indent=1), flush=True)
    host["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]
    document = {
        "benchmark": "bootstrap_probes",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "host": host,
        "versions": versions(("ours",)),
        "settings": {
            "floods": args.floods,
            "seconds": args.seconds,
            "fill_values": args.fill_values,
            "workers": args.workers,
        },
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
