"""The static rendezvous across four real processes sharing one store."""

from __future__ import annotations

import multiprocessing
import queue
from typing import Any

import static_workers

WORLD_SIZE = 4


def test_four_processes_share_one_store(free_port: int) -> None:
    context = multiprocessing.get_context("spawn")
    results: Any = context.Queue()
    run_id = "job-4"
    processes = [
        context.Process(
            target=static_workers.run_rank,
            args=(free_port, rank, WORLD_SIZE, run_id, results),
            name=f"static-rank-{rank}",
        )
        for rank in range(WORLD_SIZE)
    ]
    # Clients first: they must keep retrying until rank 0 hosts the store.
    for process in reversed(processes):
        process.start()
    reports: dict[int, dict[str, Any]] = {}
    try:
        for _ in range(WORLD_SIZE):
            try:
                report = results.get(timeout=120)
            except queue.Empty:
                raise AssertionError(f"ranks missing after 120 s; got {sorted(reports)}") from None
            assert "error" not in report, f"rank {report['rank']} failed:\n{report['error']}"
            reports[report["rank"]] = report
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
                process.join()
    assert [process.exitcode for process in processes] == [0] * WORLD_SIZE

    assert sorted(reports) == list(range(WORLD_SIZE))
    expected_seen = {str(rank): f"from rank {rank}" for rank in range(WORLD_SIZE)}
    bootstraps = {tuple(report["bootstrap"]) for report in reports.values()}
    assert len(bootstraps) == 1, f"bootstrap_store_info differs between ranks: {bootstraps}"
    # Workers may reuse the agent store: the bootstrap store is rank 0's store.
    assert bootstraps == {("127.0.0.1", free_port)}
    for rank, report in reports.items():
        assert report["world_size"] == WORLD_SIZE
        assert report["seen"] == expected_seen
        assert report["raw"] == f"from rank {rank}"
        assert report["second"] == [rank, WORLD_SIZE, report["bootstrap"]]
        assert report["backend"] == "static"
        assert report["run_id"] == run_id
        assert report["use_agent_store"] is True
        assert report["closed"] is False
        assert report["waiting"] == 0
    # One shared counter: every rank's add() saw a distinct value.
    assert sorted(report["counter"] for report in reports.values()) == [1, 2, 3, 4]
    assert reports[0]["total"] == WORLD_SIZE
