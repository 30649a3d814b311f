#!/usr/bin/env python3
"""Seconds from killing a node of a torchrun job until the survivor trains again: ours and torch's.

The job is the interop suite's (``tests/interop/torchrun_job.py``): two
``torchrun --nnodes=1:2 --nproc-per-node=2 --max-restarts=3`` agents on one
``tp-rdzv store``, training a small DDP model on gloo. Once both train, one
node (agent and workers) is killed with SIGKILL; the figure is the time from
the kill until the first training step of the survivor's workers after their
restart (the earliest of their first ``all_reduce``-checked steps); a second
row per way is the time until the first of those workers started (the
agent's detection and the rendezvous, without torch's import in the
workers); a third is the *detection time*, from the kill until the survivor
logged the dead node's removal (``departures.py`` says which records count,
for ours and for torch). Each agent runs through ``logged_torchrun.py``, which
notes those records. For ours, each run also records whether the dead node's
agent held the steward lease (read from the store before the kill) and when
the survivor took the lease over. Both
implementations run with the same rendezvous settings
(``keep_alive_interval=1,keep_alive_max_attempt=2,last_call_timeout=1``):

- **ours**: ``--rdzv-backend=tp`` (this repository's torchrun plugin);
- **torch**: ``--rdzv-backend=c10d`` (torch's own dynamic rendezvous).

Each way (the killed node is group rank 0, group rank 1, or the node whose
agent holds our steward lease, read from the store: torch has no steward, its
runs of that way kill group rank 0) runs ``--runs`` times per implementation,
interleaved; the table shows medians, the
JSON every run, with the restart the survivor resumed at (1 is the first;
a run whose survivor failed for good is counted and has no time).

``python benchmarks/restart_bench.py [--runs 3] [--out PATH]``; needs torch 2.13.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from departures import first_removal, first_takeover, read_departures
from hostinfo import host_info, load_average, versions
from logged_torchrun import DEPARTURES_ENV
from metrics import Metric, format_table, write_results

HERE = Path(__file__).resolve().parent
# The job harness is shared with the interop test that runs the same job.
sys.path.insert(0, str(HERE.parent / "tests" / "interop"))

from torchrun_job import (  # noqa: E402
    FAST_FAILOVER,
    RDZV_CONF,
    WORKERS_PER_NODE,
    ElasticJob,
    JobError,
    start_store,
)

DEFAULT_OUT = HERE / "results" / "restart_bench.json"
BACKENDS = {"ours": "tp", "torch": "c10d"}
#: Every agent runs torchrun through this, which notes the departure records.
LAUNCHER = (sys.executable, str(HERE / "logged_torchrun.py"))
#: Generous bounds: a loaded machine takes many seconds just to import torch.
START_TIMEOUT = 300.0
RESUME_TIMEOUT = 300.0
#: The ways a node is picked to die: its group rank, or None for the steward's node.
WAYS: dict[str, int | None] = {
    "group rank 0": 0,
    "group rank 1": 1,
    "the steward's node": None,
}


def one_run(directory: Path, endpoint: str, backend: str, way: str) -> dict[str, Any]:
    """Kill the node ``way`` names in a fresh job; when the survivor detected it, when
    and at which restart it trained again (``seconds`` is None when it never did)."""
    departures = directory / "departures"
    departures.mkdir(parents=True)
    job = ElasticJob(
        directory,
        backend,
        endpoint,
        RDZV_CONF,
        launcher=LAUNCHER,
        env={DEPARTURES_ENV: str(departures)},
    )
    try:
        job.start()
        trained = job.wait_until_training(START_TIMEOUT)
        steward = job.steward_pid() if backend == "tp" else None
        rank = WAYS[way]
        if rank is None and steward is not None:
            victim = job.node_of(steward)
        else:  # torch has no steward: its runs of that way kill group rank 0
            victim = job.node_of_group_rank(rank or 0, 0)
        group_rank = next(
            r["group_rank"] for r in trained.values() if r["agent_pid"] == victim.proc.pid
        )
        survivor, killed_at = job.kill_node(victim)
        exit_code = job.wait_exit(survivor, RESUME_TIMEOUT)
        noted = read_departures(departures)
        removal = first_removal(noted, victim.proc.pid, killed_at)
        # torch can drop a node whose keep-alive a loaded machine delayed, and never
        # list it again: then nothing detects its death, the survivor's workers fail.
        early = first_removal(noted, victim.proc.pid, 0.0)
        takeover = first_takeover(noted, killed_at)
        result: dict[str, Any] = {
            "killed_group_rank": group_rank,
            "seconds": None,
            "workers_started": None,
            "detected": None if removal is None else round(removal.wall - killed_at, 3),
            "detected_by": None if removal is None else removal.action,
            "removed_before_kill": early is not None and early.wall < killed_at,
            "victim_was_steward": None if steward is None else steward == victim.proc.pid,
            "takeover": None if takeover is None else round(takeover.wall - killed_at, 3),
            "restart": None,
            "exit": exit_code,
        }
        for attempt in (1, 2, 3):
            names = [f"done-a{attempt}-r{rank}" for rank in range(WORKERS_PER_NODE)]
            if all((job.markers / name).exists() for name in names):
                resumed = job.wait_for(names, 0).values()
                result["seconds"] = round(min(r["first_step"] for r in resumed) - killed_at, 3)
                started = min(r["started"] for r in resumed)
                result["workers_started"] = round(started - killed_at, 3)
                result["restart"] = attempt
                break
        return result
    finally:
        job.close()


def summarize(runs: list[dict[str, Any]], way: str, field: str, what: str) -> Metric:
    """The medians of ``field`` over the runs of ``way``."""
    metric = Metric(f"kill {way}: {what}", "s", "lower")
    for impl in BACKENDS:
        mine = [r for r in runs if r["impl"] == impl and r["way"] == way]
        times = [r[field] for r in mine if r.get(field) is not None]
        setattr(metric, impl, statistics.median(times) if times else None)
        metric.notes[impl] = (
            f"runs {[r.get(field) for r in mine]}, resumed at restart "
            f"{[r['restart'] for r in mine]}"
        )
        if impl == "ours":
            stewards = [r.get("victim_was_steward") for r in mine]
            metric.notes[impl] += f", the dead node was the steward {stewards}"
    return metric


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per implementation and way")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON written")
    args = parser.parse_args()

    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    host = host_info()
    began = time.monotonic()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        with (root / "store.log").open("w") as log:
            store, endpoint = start_store(log)
            try:
                for number, way in enumerate(WAYS):
                    for index in range(args.runs):
                        for impl, backend in BACKENDS.items():
                            where = root / f"{impl}-way{number}-{index}"
                            try:
                                result = one_run(where, endpoint, backend, way)
                            except JobError as exc:
                                # The agents' logs, kept for a failed run (the scratch goes).
                                kept = args.out.parent / "failed-runs" / where.name
                                shutil.copytree(where, kept, dirs_exist_ok=True)
                                result = {
                                    "seconds": None,
                                    "restart": None,
                                    "error": str(exc)[:4000],
                                    "logs": str(
                                        kept.relative_to(HERE.parent)
                                        if kept.is_relative_to(HERE.parent)
                                        else kept
                                    ),
                                }
                            runs.append({"impl": impl, "way": way, **result})
                            print(json.dumps(runs[-1])[:300], flush=True)
            finally:
                store.terminate()
                store.wait(30)

    metrics = [
        summarize(runs, way, field, what)
        for way in WAYS
        for field, what in (
            ("detected", "until the survivor logs the removal (detection)"),
            ("workers_started", "until its new workers start"),
            ("seconds", "until the survivor's first step"),
        )
    ]
    print(format_table(metrics))
    for metric in metrics:
        for impl, note in metric.notes.items():
            print(f"  {metric.name} [{impl}]: {note}")

    write_results(
        args.out,
        {
            "benchmark": "restart_bench",
            "date": date,
            "host": host | {"load_average_at_end": load_average()},
            "versions": versions(list(BACKENDS)),
            "seconds": round(time.monotonic() - began, 1),
            "config": {"rdzv_conf": FAST_FAILOVER, "runs": args.runs},
            "metrics": [metric.to_json() for metric in metrics],
            "runs": runs,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
