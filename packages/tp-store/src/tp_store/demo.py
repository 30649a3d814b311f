"""``python -m tp_store.demo``: a live look at the store doing a job's bootstrap.

The demo hosts a master ``TCPStore`` in this process and starts worker
processes that connect to it, count themselves in, exchange their addresses
and meet at a barrier: what every distributed job does at start. Progress is
driven by the workers' events on a store queue (no polling), and the run ends
with a summary of what the store did and how fast.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from .stores.tcp_store import TCPStore

_EVENTS = "demo/events"
_BAR_WIDTH = 30


def _worker(port: int, rank: int, world_size: int, rounds: int) -> None:
    store = TCPStore("127.0.0.1", port, timeout=30)
    store.set(f"demo/addr/{rank}", f"worker-{rank}@127.0.0.1")
    store.queue_push(_EVENTS, json.dumps({"rank": rank, "event": "joined"}))
    peers = store.multi_get([f"demo/addr/{peer}" for peer in range(world_size)])
    for _ in range(rounds):
        store.add("demo/work", 1)
    store.queue_push(_EVENTS, json.dumps({"rank": rank, "event": "worked", "peers": len(peers)}))
    store.barrier("demo/barrier", world_size)
    store.queue_push(_EVENTS, json.dumps({"rank": rank, "event": "done"}))
    store.close()


def _bar(done: int, total: int) -> str:
    filled = _BAR_WIDTH * done // total
    return f"[{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {done}/{total}"


@dataclass(frozen=True)
class Summary:
    """What the demo measured."""

    workers: int
    adds: int
    expected_adds: int
    seconds: float
    failed_workers: int

    @property
    def ok(self) -> bool:
        """Every worker finished and every add was counted exactly once."""
        return self.adds == self.expected_adds and self.failed_workers == 0


def run(workers: int, rounds: int, out: TextIO | None = None) -> Summary:
    """Run the demo, drawing progress on ``out`` (stdout by default)."""
    out = out or sys.stdout
    write = out.write
    started = time.perf_counter()
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=60)
    write(f"store listening on 127.0.0.1:{master.port}; starting {workers} workers\n")
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_worker, args=(master.port, rank, workers, rounds))
        for rank in range(workers)
    ]
    for process in processes:
        process.start()
    counts = {"joined": 0, "worked": 0, "done": 0}
    for _ in range(3 * workers):
        event = json.loads(master.queue_pop(_EVENTS))
        counts[event["event"]] += 1
        line = "  ".join(f"{name:>6} {_bar(count, workers)}" for name, count in counts.items())
        write(f"\r{line}")
        out.flush()
    finished = time.perf_counter()
    write("\n")
    for process in processes:
        process.join()
    summary = Summary(
        workers=workers,
        adds=int(master.get("demo/work")),
        expected_adds=workers * rounds,
        seconds=round(finished - started, 3),
        failed_workers=sum(1 for process in processes if process.exitcode != 0),
    )
    master.close()
    write(
        f"{'OK' if summary.ok else 'FAILED'}: {workers} workers joined, exchanged addresses, "
        f"did {summary.adds} adds and met at a barrier in {summary.seconds} s\n"
    )
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; exit code 0 when every worker finished and every add counted."""
    parser = argparse.ArgumentParser(prog="python -m tp_store.demo", description=__doc__)
    parser.add_argument("--workers", type=int, default=8, help="worker processes (default 8)")
    parser.add_argument("--rounds", type=int, default=200, help="adds per worker (default 200)")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.rounds < 0:
        parser.error("--workers must be >= 1 and --rounds >= 0")
    return 0 if run(args.workers, args.rounds).ok else 1


if __name__ == "__main__":
    sys.exit(main())
