"""Large rounds: 1,000 to 16,000 nodes over processes, the store server alone (one command).

    python benchmarks/scale_bench.py [--cases 1000:8,4000:16,10000:16,16000:32] [--runs 1]
                                     [--profile DIR] [--json PATH]

Each case is ``rdzv_bench.py``'s spread scenario (``spread.py``: N nodes over P
processes, each node its own handler, store connection and presence session,
which lives on that connection, as one node per host has when deployed;
the server ``python -m tp_store`` alone in its own process; one start signal),
ours only, with its defaults (``max_connections`` included). Per run it
reports the last and first returns, the server's CPU and the node processes'
CPU per node (and the kernel's part of it, and their context switches per
node: where threads of a process hand the GIL around, the switches grow with
the CPU), the server's bytes sent per node, the time split (joins,
decision, publish, answers), and the nodes a removal record named (every node
is alive: any is a false death). Ranks are checked to be exactly 0..N-1.

Limits: N nodes hold about N connections to the server (each node one: its
store connection, which holds its presence session and carries its ticks; a
steward's few more), so the bench raises the open-file
limit (soft, and hard as root up to ``/proc/sys/fs/nr_open``) for itself
and the processes it starts, and, when
the client connections to the one server address would not fit the
ephemeral port range (``net.ipv4.ip_local_port_range``: ~28,000 ports by
default), widens that range as root for the run
and restores it after. It prints what it changed. Each run starts once the
connections an earlier run closed have left TIME_WAIT (it waits up to
``TIME_WAIT_LIMIT`` seconds, and records the count). Results go to
``benchmarks/results/scale_bench.json``; ``report.py`` plots them.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import resource
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hostinfo import host_info, load_average, settle_time_wait, versions
from metrics import write_results
from spread import SpreadCase, run_spread

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "scale_bench.json"
DEFAULT_CASES = ("1000:8", "4000:16", "10000:16", "16000:32")
PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
NR_OPEN = Path("/proc/sys/fs/nr_open")
#: Client connections of other programs to keep room for in the port range.
PORT_MARGIN = 4096
#: Open files besides the connections (the bench's own pipes, logs, the interpreter).
SPARE_FILES = 4096
THREAD_STACK_BYTES = 256 * 1024
#: The node processes' switch interval: a real node process has a handful of
#: threads; one simulating hundreds of nodes would otherwise spend its CPU
#: handing the GIL between them every 5 ms (benchmarks/README.md measured it).
SWITCH_INTERVAL = 0.05
#: Each run starts once fewer sockets than this are in TIME_WAIT (an earlier
#: run's closed connections), waiting at most TIME_WAIT_LIMIT seconds: runs
#: made back to back drifted from 11.6 s to 16.8 s at 16,000 nodes otherwise.
TIME_WAIT_BELOW = 1000
TIME_WAIT_LIMIT = 90.0


def connections(case: SpreadCase) -> int:
    """The connections of ``case`` to the server: each node's one, a steward's few,
    and the bench's own."""
    return case.nodes + 16


def raise_open_files(needed: int) -> str:
    """Raise this process's open-file limit (inherited by its children) to ``needed``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = max(soft, needed)
    if hard != resource.RLIM_INFINITY and hard < target:
        ceiling = int(NR_OPEN.read_text()) if NR_OPEN.exists() else hard
        if os.geteuid() == 0:
            hard = min(target, ceiling)
        target = min(target, hard)
    if target == soft:
        enough = "enough" if soft >= needed else f"fewer than the {needed} needed"
        return f"open files: {soft} (soft), {hard} (hard), {enough}"
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:  # raising the hard limit needs CAP_SYS_RESOURCE
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return (
            f"open files: {hard}, the hard limit, for the {needed} wanted "
            f"(could not raise the hard limit: {exc})"
        )
    return f"open files: raised from {soft} to {target} (hard limit now {hard})"


@contextlib.contextmanager
def port_range_for(needed: int) -> Iterator[str]:
    """The ephemeral port range widened (as root) so ``needed`` connections to one address
    fit with room to spare; restored on exit, failure included."""
    if not PORT_RANGE.exists():
        yield "port range: unknown (not Linux)"
        return
    before = PORT_RANGE.read_text().split()
    low, high = int(before[0]), int(before[1])
    if high - low + 1 >= needed + PORT_MARGIN:
        yield f"ephemeral ports: {low}-{high}, enough"
        return
    if os.geteuid() != 0:
        yield (
            f"ephemeral ports: {low}-{high} fit fewer than the {needed} connections needed; "
            "not root, so left as is (connections past them fail)"
        )
        return
    wider_low = max(1024, min(low, high - needed - PORT_MARGIN))
    PORT_RANGE.write_text(f"{wider_low} {high}")
    try:
        yield f"ephemeral ports: widened from {low}-{high} to {wider_low}-{high} for the run"
    finally:
        PORT_RANGE.write_text(f"{low} {high}")


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """The least-squares slope of log(y) against log(x): the exponent of y ~ x^k."""
    usable = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len(usable) < 2:
        return None
    mean_x = sum(x for x, _ in usable) / len(usable)
    mean_y = sum(y for _, y in usable) / len(usable)
    spread = sum((x - mean_x) ** 2 for x, _ in usable)
    if spread == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in usable) / spread


def fitted_slopes(runs: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """The log-log slopes against N of the last return and of the CPU per node."""
    ok = [run for run in runs if "error" not in run]
    fits = {
        "last": [(run["nodes"], run["last"]) for run in ok],
        "nodes_cpu_ms_per_node": [(run["nodes"], run["nodes_cpu_ms_per_node"]) for run in ok],
        "server_cpu_ms_per_node": [(run["nodes"], run["server_cpu_ms_per_node"]) for run in ok],
    }
    return {
        name: None if (k := slope(points)) is None else round(k, 3) for name, points in fits.items()
    }


def run_case(
    case: SpreadCase, timeout: float, profile: Path | None, switch_interval: float | None
) -> dict[str, Any]:
    """One run of ``case``; an ``error`` entry instead of figures if it failed."""
    run_id = f"bench-scale-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    try:
        result = run_spread("ours", case, timeout, run_id, profile, switch_interval=switch_interval)
    except (RuntimeError, TimeoutError, OSError) as exc:
        return {
            "case": case.name,
            "nodes": case.nodes,
            "processes": case.processes,
            "error": str(exc)[:2000],
            "seconds": round(time.monotonic() - started, 1),
            "load": load_average(),
        }
    return {"case": case.name, "processes": case.processes, **result.to_json()} | {
        "returns": None  # every node's return is in the spread bench's JSON; not needed here
    }


def describe(run: dict[str, Any]) -> str:
    if "error" in run:
        return f"{run['case']}: FAILED ({run['error'][:300]}), load {run['load']}"
    split = ", ".join(f"{name} {value:.2f} s" for name, value in run["split"].items())
    sent = run["bytes_sent_per_node"]
    return (
        f"{run['case']}: last {run['last']:.2f} s, first {run['first']:.2f} s; "
        f"server CPU {run['server_cpu']:.2f} s ({run['server_cpu_ms_per_node']:.3f} ms/node), "
        f"node processes' CPU {run['nodes_cpu']:.1f} s ({run['nodes_cpu_ms_per_node']:.3f} "
        f"ms/node; the kernel's {run['nodes_cpu_system']:.1f} s; "
        f"{run['switches_per_node']} context switches per node), "
        f"server sent {sent} B/node; {run['connections_per_node']} server "
        f"connections per node; {split}; removed {len(run['removed'])}; "
        f"load {run['load']}"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases",
        type=lambda text: [SpreadCase.parse(part) for part in text.split(",") if part],
        default=[SpreadCase.parse(text) for text in DEFAULT_CASES],
        help=f"N:P cases (default {','.join(DEFAULT_CASES)})",
    )
    parser.add_argument("--runs", type=int, default=1, help="runs of each case (default 1)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds allowed a round")
    parser.add_argument("--profile", type=Path, help="py-spy stacks of every process, in this dir")
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=SWITCH_INTERVAL,
        help=(
            "the node processes' sys.setswitchinterval (seconds; default "
            f"{SWITCH_INTERVAL}, Python's own 0.005)"
        ),
    )
    parser.add_argument("--json", type=Path, default=DEFAULT_OUT, help="results (JSON)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    threading.stack_size(THREAD_STACK_BYTES)
    largest = max(args.cases, key=lambda case: case.nodes)
    limits = [raise_open_files(connections(largest) + SPARE_FILES)]
    runs: list[dict[str, Any]] = []
    host = host_info()
    with port_range_for(connections(largest)) as ports:
        limits.append(ports)
        for line in limits:
            print(line, flush=True)
        for case in args.cases:
            for _ in range(args.runs):
                settled = settle_time_wait(TIME_WAIT_BELOW, TIME_WAIT_LIMIT)
                print(settled, flush=True)
                profile = None if args.profile is None else args.profile / f"{case.nodes}"
                run = run_case(case, args.timeout, profile, args.switch_interval)
                run["time_wait"] = settled
                print(describe(run), flush=True)
                runs.append(run)
    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": host | {"load_average_at_end": load_average()},
        "versions": versions(["ours"]),
        "limits": limits,
        "switch_interval": args.switch_interval,
        "runs": runs,
        "slopes": fitted_slopes(runs),
    }
    print(f"log-log slopes against N: {report['slopes']}")
    write_results(args.json, report)
    return 1 if any("error" in run for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
