"""A round of hundreds of nodes over several processes, on a real server: exact ranks, and
what each node costs the server (one connection; its answer, not the whole round)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tp_store import TCPStore

CROWD = Path(__file__).resolve().parent / "node_crowd.py"
PROCESSES = 4
PER_PROCESS = 75
WORLD = PROCESSES * PER_PROCESS


def test_hundreds_of_nodes_over_processes_complete_one_round_with_exact_ranks(
    server: TCPStore,
) -> None:
    command = [sys.executable, str(CROWD), "127.0.0.1", str(server.port), "crowd"]
    crowd = [
        subprocess.Popen(
            [*command, str(PER_PROCESS), str(WORLD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    try:
        for process in crowd:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "ready"
        before = server.server_stats()
        for process in crowd:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        reports = []
        for process in crowd:
            assert process.stdout is not None
            reports.append(json.loads(process.stdout.readline()))
        after = server.server_stats()
    finally:
        for process in crowd:
            process.kill()
            process.wait()
    ranks = sorted(rank for report in reports for rank in report["ranks"])
    assert ranks == list(range(WORLD))
    assert {size for report in reports for size in report["world_sizes"]} == {WORLD}
    # Every process read the same list from the round's roster, in rank order.
    lists = {tuple(report["participants"]) for report in reports}
    assert len(lists) == 1
    assert len(next(iter(lists))) == WORLD
    # A node costs the server one connection of its own: each process's nodes
    # share one presence session and one ticks' connection (and a steward has
    # a few), instead of two or three per node.
    opened = after["connections_accepted"] - before["connections_accepted"]
    assert opened <= 3 * PROCESSES + 8, opened
    # What the server sent per node does not hold the participant list (~30 bytes
    # a node, ~9 KB here): each node reads its own answer.
    assert (after["bytes_sent"] - before["bytes_sent"]) / WORLD < 2048
