#!/usr/bin/env python3
"""The spread round on etcd: N nodes over P processes, every node its own handler,
``EtcdStore`` and lease, ``min_nodes = max_nodes = N``, default settings (``spread.py``).

For each ``N:P`` case the bench starts a fresh etcd (one member for
``--cases``; three on loopback for ``--kill-cases``, the leader killed
``--kill-leader`` seconds into the round), runs one round, checks ranks
0..N-1, and reports the time from the start signal to the last node's return,
etcd's requests in the round by gRPC method (the messages the members
received, ``grpc_server_msg_received_total``, every member summed: each
keep-alive on a stream counts, as each watch request does) and per node, the
nodes' requests by method and key family (counted in the node processes,
:mod:`etcd_requests`), and the members' CPU seconds (per node).
A kill case's round must still complete with every node. One command runs
them all, writing ``results/etcd_round.json`` and ``results/etcd_round_kill.json``
(``report.py`` makes the report's etcd section of them):

    python benchmarks/etcd_round.py [--etcd-binary /usr/bin/etcd]
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import threading
import time
import urllib.request
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hostinfo import host_info, load_average, versions
from metrics import write_results
from spread import (
    ROUND_CONFIG,
    SpreadCase,
    SpreadGroup,
    StoreProcess,
    process_cpu_seconds,
    split,
)

from tp_rdzv_etcd.local import LocalEtcd, etcd_version, find_etcd

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "etcd_round.json"
KILL_OUT = HERE / "results" / "etcd_round_kill.json"
#: The last: one node per process, as one agent per host runs (nothing shared in a process).
CASES = "128:4,1000:8,2000:8,4000:16,128:128"
KILL_CASES = "1000:8"
#: Into the joins of a 1,000-node round (about 1 s of its 1.5 s).
KILL_AFTER = 0.5
TORCH_OUT = HERE / "results" / "etcd_round_torch.json"
TORCH_CASES = "32:4,128:4"
# Messages, not calls: a stream's keep-alives each count (a call counts once, at its end).
_RECEIVED = re.compile(
    r'^grpc_server_msg_received_total\{[^}]*grpc_method="(\w+)"[^}]*\} (\S+)$', re.M
)


class LocalEtcdView:
    """Some members of a cluster, for :func:`received`."""

    def __init__(self, members: list[Any]) -> None:
        self.members = members


def received(cluster: LocalEtcd | LocalEtcdView) -> dict[str, int]:
    """Requests the live members have received so far, by gRPC method (all members summed):
    unary calls, keep-alives and watch requests alike."""
    counts: dict[str, int] = {}
    for member in cluster.members:
        if not member.alive():
            continue
        try:
            with urllib.request.urlopen(member.client_url + "/metrics", timeout=10) as answer:
                text = answer.read().decode()
        except OSError:
            continue
        for method, value in _RECEIVED.findall(text):
            counts[method] = counts.get(method, 0) + int(float(value))
    return counts


def members_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):  # killed: _kill_leader noted its CPU
            total += process_cpu_seconds(pid)
    return total


def run_case(case: SpreadCase, args: argparse.Namespace, binary: str) -> dict[str, Any]:
    torch = args.impl == "torch"
    spec = {
        "impl": args.impl,
        "run_id": f"bench-etcd-{case.nodes}-{uuid.uuid4().hex[:8]}",
        "min_nodes": case.nodes,
        "max_nodes": case.nodes,
        "config": ROUND_CONFIG,
        "timeout": args.timeout,
        "count_requests": not torch,
        "transport": args.transport,
    }
    v2 = ["--enable-v2"] if torch else []  # torch's etcd-v2 needs the v2 API (etcd <= 3.5)
    with LocalEtcd(args.members, binary=binary, extra_args=v2) as cluster:
        pids = [member.pid for member in cluster.members if member.pid is not None]
        # The process SpreadGroup times: one that lives through the round (a follower).
        leader = cluster.leader()
        lasting = next((m for m in cluster.members if m is not leader), leader).pid
        assert lasting is not None
        store = "etcd-v2" if torch else "etcd"
        # etcd's counters and CPU as the round starts and as the last node returned,
        # before the bench checks the round (each process then reads the roster
        # once: not the round's cost).
        cpu_seen: list[float] = []

        def requests_and_cpu() -> dict[str, int]:
            cpu_seen.append(members_cpu(pids))
            return received(cluster)

        process = StoreProcess(cluster.endpoints, lasting, store=store, requests=requests_and_cpu)
        group = SpreadGroup(process, args.timeout, args.profile)
        try:
            for count in split(case.nodes, case.processes):
                group.start(spec | {"count": count})
            group.collect("ready", group.slots, max(args.timeout, 120))
            if not torch:
                for node in group.nodes:
                    node.tell("requests")  # set-up's requests are not the round's
                group.collect("requests", group.slots, args.timeout)
            killed: dict[str, Any] = {}
            if args.kill_leader is not None:
                timer = threading.Timer(args.kill_leader, _kill_leader, (cluster, killed))
                timer.start()
            result = group.first_round(case.nodes)
            if args.kill_leader is not None:
                timer.join()  # the election's length noted
            # The killed member's CPU until the kill counts; members_cpu skips it after.
            cpu = cpu_seen[-1] + killed.get("cpu", 0.0) - cpu_seen[0]
            # The killed member's counters went with it: its count until the kill.
            counted = dict(result.ops)
            for method, count in killed.get("requests", {}).items():
                counted[method] = counted.get(method, 0) + count
            reported: dict[int, dict[str, Any]] = {}
            if not torch:
                for node in group.nodes:
                    node.tell("requests")
                reported = group.collect("requests", group.slots, args.timeout)
        finally:
            group.stop()
    # Status: the bench's own look for the leader (the nodes never ask it).
    methods = {
        method: count
        for method, count in sorted(counted.items())
        if count > 0 and method != "Status"
    }
    families: dict[str, int] = {}
    for message in reported.values():
        for name, count in message["counts"].items():
            families[name] = families.get(name, 0) + count
    total = sum(methods.values())
    return {
        "impl": args.impl,
        "nodes": case.nodes,
        "processes": case.processes,
        "members": args.members,
        "round": result.to_json() | {"returns": None, "server_cpu": None},
        "seconds": round(result.last, 3),
        "etcd_cpu": round(cpu, 3),
        "etcd_cpu_ms_per_node": round(1000 * cpu / case.nodes, 3),
        "requests": methods,
        "requests_per_node": round(total / case.nodes, 2),
        "client_requests": dict(sorted(families.items(), key=lambda item: -item[1])),
        "killed_leader": None
        if not killed
        else {"member": killed["member"], "elected_after": killed.get("elected_after")},
        "load": load_average(),
    }


def _kill_leader(cluster: LocalEtcd, killed: dict[str, Any]) -> None:
    """Kill the leader, noting its requests and CPU until then (they count in the round)."""
    leader = cluster.leader()
    assert leader.pid is not None
    requests = received(LocalEtcdView([leader]))
    cpu = process_cpu_seconds(leader.pid)
    leader.kill()
    at = time.monotonic()
    killed.update(member=leader.name, at=at, requests=requests, cpu=cpu)
    # The election's length, from outside: until a live member names a live leader.
    while time.monotonic() - at < 60:
        with contextlib.suppress(RuntimeError):
            cluster.leader()
            killed["elected_after"] = round(time.monotonic() - at, 3)
            return
        time.sleep(0.05)


def run_cases(
    cases: str,
    *,
    members: int,
    kill_leader: float | None,
    args: argparse.Namespace,
    binary: str,
    out: Path,
    impl: str = "ours",
    timeout: float | None = None,
) -> None:
    """Every ``N:P`` case of ``cases`` on a fresh cluster of ``members``; results to ``out``.

    ``impl`` ``torch``: torch's ``etcd-v2`` backend, each case allowed ``timeout`` seconds.
    """
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    overrides = {"members": members, "kill_leader": kill_leader, "impl": impl}
    setup = argparse.Namespace(**(vars(args) | overrides | {"timeout": timeout or args.timeout}))
    runs = []
    for text in cases.split(","):
        case = SpreadCase.parse(text)
        try:
            run = run_case(case, setup, binary)
        except (RuntimeError, TimeoutError) as exc:
            run = {"nodes": case.nodes, "processes": case.processes, "error": str(exc)[:2000]}
        print(run, flush=True)
        runs.append(run)
    write_results(
        out,
        {
            "benchmark": "etcd_round",
            "date": date,
            "host": host_info() | {"load_average_at_end": load_average()},
            "versions": versions([impl]) | {"etcd": etcd_version(binary)},
            "config": {
                "members": members,
                "kill_leader": kill_leader,
                "settings": ROUND_CONFIG,
                "transport": args.transport if impl == "ours" else None,
                "impl": impl,
                "timeout": setup.timeout,
            },
            "runs": runs,
        },
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases", default=CASES, help=f"N:P,... on one member, '' for none (default {CASES})"
    )
    parser.add_argument(
        "--kill-cases",
        default=KILL_CASES,
        help=f"N:P,... on three members, the leader killed, '' for none (default {KILL_CASES})",
    )
    parser.add_argument(
        "--kill-leader",
        type=float,
        default=KILL_AFTER,
        help=f"seconds into a kill case's round the leader dies (default {KILL_AFTER})",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per round")
    parser.add_argument(
        "--transport",
        choices=("auto", "grpc", "gateway"),
        default="auto",
        help="how the nodes' EtcdStores reach etcd (default auto: gRPC)",
    )
    parser.add_argument(
        "--torch-cases",
        default=TORCH_CASES,
        help=f"N:P,... of torch's etcd-v2 on one member with the v2 API, '' for none "
        f"(default {TORCH_CASES}; needs python-etcd)",
    )
    parser.add_argument(
        "--torch-timeout", type=float, default=200.0, help="seconds allowed per torch round"
    )
    parser.add_argument("--torch-out", type=Path, default=TORCH_OUT, help="torch's results")
    parser.add_argument(
        "--profile", type=Path, help="py-spy every node process (on-GIL samples) into this dir"
    )
    parser.add_argument("--etcd-binary", help="default: $TP_ETCD_BINARY, etcd on PATH, ...")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the one-member results")
    parser.add_argument("--kill-out", type=Path, default=KILL_OUT, help="the kill cases' results")
    args = parser.parse_args(argv)
    binary = find_etcd(args.etcd_binary)
    if binary is None:
        sys.exit("no etcd binary (--etcd-binary)")
    if args.cases:
        run_cases(args.cases, members=1, kill_leader=None, args=args, binary=binary, out=args.out)
    if args.kill_cases:
        run_cases(
            args.kill_cases,
            members=3,
            kill_leader=args.kill_leader,
            args=args,
            binary=binary,
            out=args.kill_out,
        )
    if args.torch_cases:
        run_cases(
            args.torch_cases,
            members=1,
            kill_leader=None,
            args=args,
            binary=binary,
            out=args.torch_out,
            impl="torch",
            timeout=args.torch_timeout,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
