#!/usr/bin/env python3
"""The connect storm of a job's workers on the bootstrap store: ours against torch's.

When a round completes, every worker of the job connects to rank 0's bootstrap
store at once, ``add``s a counter, and waits for one key that the last one
sets (NCCL's unique id). Here N of torch's C++ clients, spread over P client
processes (threads, each its own connection), do exactly that, against:

- **ours**: the store as deployed, in the child process rank 0's agent starts
  (``tp_rdzv_dynamic.node.bootstrap_process``), with its bootstrap limits;
- **torch**: torch's libuv master alone in a process (``torch_store_server.py``).

Trials alternate ours and torch, each on a fresh server, after one storm
that is not counted (the clients' first is slower); the tables keep the
medians. Per trial: the time from "go" to the last worker done, the connect
phase (go to the last connect returned), the server process's CPU time
(``/proc/PID/stat``), and the connects that took over 4 s: torch's client
does a reverse DNS lookup of the peer on every connect, and a resolver that
drops lookups stalls it 5 s (both servers alike; an ``/etc/hosts`` line for
``::ffff:127.0.0.1`` removes it). Our server does no lookup. Run as root with
``unshare`` at hand, the client processes get that line in a private mount
namespace (the machine's ``/etc/hosts`` is left alone); ``--system-hosts``
keeps the machine's file. The results say which, and how many stalls were seen.

    python benchmarks/storm_bench.py                       # 4096/8 and 8192/16, 3 trials each
    python benchmarks/storm_bench.py --sizes 1024/4 --trials 2
    python benchmarks/storm_bench.py --sizes 8192/16 --trials 1 --profile /tmp/storm.txt
    python benchmarks/storm_bench.py --floor --syscalls    # with the floor, syscalls per worker
    python benchmarks/storm_bench.py --compiled DIR        # our child from a mypyc build too

Every process it starts is ended before it exits, also on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "storm_bench.json"
#: A connect slower than this was stalled (torch's client's reverse lookup, 5 s).
STALL_SECONDS = 4.0
#: Bounds for a loaded machine: torch's imports take seconds in each process.
_READY_TIMEOUT = 600.0
_TRIAL_TIMEOUT = 600.0
_CLIENT_TIMEOUT = timedelta(seconds=300)
_UNIQUE_ID = b"u" * 128  # the size of NCCL's unique id
_TICK = os.sysconf("SC_CLK_TCK")  # /proc's CPU times count these per second


# -- the client processes ---------------------------------------------------------
def client_main(count: int) -> None:
    """A client process: per ``go HOST PORT TOTAL`` line, ``count`` workers storm the store."""
    import torch.distributed as dist

    print("ready", flush=True)
    for line in sys.stdin:
        _, host, port, total = line.split()
        print(json.dumps(storm(dist.TCPStore, host, int(port), int(total), count)), flush=True)


def storm(store_class: Any, host: str, port: int, total: int, count: int) -> dict[str, Any]:
    """``count`` workers (threads) connect, add, and wait for the key the last one sets."""
    go = time.monotonic()
    connected = [0.0] * count
    done = [0.0] * count
    errors: list[str] = []
    stores: list[Any] = []

    def worker(index: int) -> None:
        try:
            store = store_class(
                host, port, is_master=False, wait_for_workers=False, timeout=_CLIENT_TIMEOUT
            )
            connected[index] = time.monotonic() - go
            if store.add("workers", 1) == total:
                store.set("unique_id", _UNIQUE_ID)
            if store.get("unique_id") != _UNIQUE_ID:
                raise ValueError("a wrong unique id")
            done[index] = time.monotonic() - go
            stores.append(store)  # closed once every worker is done
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stores.clear()
    return {
        "connects": sorted(connected),
        "last_done": max(done),
        "errors": errors[:5],
        "failed": len(errors),
    }


# -- the servers ----------------------------------------------------------------
def cpu_ticks(pid: int) -> tuple[int, int]:
    """User and system CPU time of process ``pid`` (all its threads) so far, in clock
    ticks: whole numbers, so that equal times compare equal once in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


class OurServer:
    """Our bootstrap store as rank 0's agent runs it: its child process."""

    name = "ours"

    def __init__(self, prefix: list[str]) -> None:
        from tp_rdzv_dynamic.node.bootstrap_process import BootstrapProcess

        self._process = BootstrapProcess()
        self.port = self._process.host("127.0.0.1")
        self.pid = self._process.pid

    def close(self) -> None:
        self._process.stop()


class CompiledServer(OurServer):
    """The same child, importing tp_store from a mypyc build (``--compiled DIR``)."""

    name = "ours-mypyc"
    build: Path | None = None

    def __init__(self, prefix: list[str]) -> None:
        assert self.build is not None, "--compiled names the build"
        build = str(self.build)
        # The child inherits the agent's environment: the build goes first on its path.
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (build, saved) if p)
        try:
            super().__init__(prefix)
        finally:
            if saved is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = saved
        # It has imported the server to answer: a build it did not load is an error.
        if build not in Path(f"/proc/{self.pid}/maps").read_text():
            self.close()
            raise RuntimeError(f"the bootstrap child loaded no compiled module from {build}")


class TorchServer:
    """torch's libuv master alone in a process (it looks up names on accept: it gets
    the clients' ``/etc/hosts``)."""

    name = "torch"
    script = "torch_store_server.py"

    def __init__(self, prefix: list[str]) -> None:
        self._process = subprocess.Popen(
            [*prefix, sys.executable, str(HERE / self.script)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line.startswith("listening on "):
            self.close()
            raise RuntimeError(f"{self.script} printed {line!r}")
        self.port = int(line.rsplit(":", 1)[1])
        self.pid = self._process.pid

    def close(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


class FloorServer(TorchServer):
    """The least a Python server on uvloop does for the storm (``storm_floor_server.py``)."""

    name = "floor"
    script = "storm_floor_server.py"


ServerClass = type[OurServer] | type[TorchServer]


# -- the bench ------------------------------------------------------------------
def private_hosts_prefix(directory: Path) -> list[str] | None:
    """A command prefix running its command with ``/etc/hosts`` plus a line naming
    ``::ffff:127.0.0.1`` (in a mount namespace of its own); None where that cannot be."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    hosts = directory / "hosts"
    hosts.write_text(Path("/etc/hosts").read_text() + "\n::ffff:127.0.0.1 localhost\n")
    prefix = ["unshare", "-m", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts)]
    probe = subprocess.run([*prefix, "true"], capture_output=True, check=False)
    return prefix if probe.returncode == 0 else None


class Clients:
    """P client processes of ``count`` workers each, started once per size."""

    def __init__(self, processes: int, count: int, prefix: list[str]) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR")
        for _ in range(processes):
            self.procs.append(
                subprocess.Popen(
                    [*prefix, sys.executable, __file__, "--client", str(count)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env=env,
                )
            )
        for proc in self.procs:
            self._line(proc, _READY_TIMEOUT)

    def storm(self, port: int, total: int) -> list[dict[str, Any]]:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(f"go 127.0.0.1 {port} {total}\n")
            proc.stdin.flush()
        return [json.loads(self._line(proc, _TRIAL_TIMEOUT)) for proc in self.procs]

    @staticmethod
    def _line(proc: subprocess.Popen[str], timeout: float) -> str:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"client process {proc.pid} did not answer within {timeout} s")
        return line

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()


def profiler(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling process ``pid`` into ``out`` (a flame graph's folded stacks) until
    interrupted."""
    beside = Path(sys.executable).with_name("py-spy")  # in the venv, if not on PATH
    spy = str(beside) if beside.exists() else "py-spy"
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [spy, "record", "--pid", str(pid), "--output", str(out), "--format", "raw"]
    proc = subprocess.Popen([*command, "--rate", "250", "--nonblocking"])
    time.sleep(1.0)  # py-spy attaches before the storm starts
    return proc


def trial(
    server_class: ServerClass,
    clients: Clients,
    total: int,
    prefix: list[str],
    profile: Path | None,
) -> dict[str, Any]:
    server = server_class(prefix)
    sampler = None
    try:
        if profile is not None and server_class is OurServer:
            sampler = profiler(server.pid, profile)
        user, system = cpu_ticks(server.pid)
        load = os.getloadavg()[0]
        reports = clients.storm(server.port, total)
        user_after, system_after = cpu_ticks(server.pid)
    finally:
        if sampler is not None:
            sampler.send_signal(signal.SIGINT)
            sampler.wait()
        server.close()
    connects = [c for report in reports for c in report["connects"]]
    return {
        "server": server_class.name,
        "seconds": max(report["last_done"] for report in reports),
        "connect_phase": max(connects),
        "connect_median": statistics.median(connects),
        "server_cpu": (user_after - user + system_after - system) / _TICK,
        "server_user": (user_after - user) / _TICK,
        "server_sys": (system_after - system) / _TICK,
        "stalls": sum(1 for c in connects if c > STALL_SECONDS),
        "failed": sum(report["failed"] for report in reports),
        "errors": [e for report in reports for e in report["errors"]][:5],
        "load": round(load, 2),
    }


def syscalls_per_worker(
    server_class: ServerClass, clients: Clients, total: int, prefix: list[str]
) -> dict[str, float]:
    """The system calls the server makes per worker in one storm (``strace -c -f``)."""
    server = server_class(prefix)
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "strace.txt"
        tracer = subprocess.Popen(
            ["strace", "-c", "-f", "-o", str(out), "-p", str(server.pid)],
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(2.0)  # attached to every thread before the storm starts
            clients.storm(server.port, total)
            time.sleep(2.0)  # the server has closed the connections the workers closed
        finally:
            tracer.send_signal(signal.SIGINT)
            tracer.wait()
            server.close()
        counts: dict[str, float] = {}
        for line in out.read_text().splitlines():
            fields = line.split()
            # "% time  seconds  usecs/call  calls  [errors]  syscall"
            if len(fields) >= 5 and fields[0][0].isdigit() and fields[-1] != "total":
                counts[fields[-1]] = round(int(fields[3]) / total, 2)
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def run_size(
    workers: int,
    processes: int,
    *,
    trials: int,
    prefix: list[str],
    profile: Path | None,
    servers: tuple[ServerClass, ...],
    syscalls: bool,
) -> dict[str, Any]:
    clients = Clients(processes, workers // processes, prefix)
    results: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"workers": workers, "processes": processes}
    try:
        # The clients' first storm is slower (their threads' first connects): a
        # storm nobody counts, so that neither server's first trial pays it.
        trial(TorchServer, clients, workers, prefix, None)
        for index in range(trials):
            for server_class in servers if index % 2 == 0 else servers[::-1]:
                out = profile and profile.with_name(f"{profile.stem}-{workers}-{index}.txt")
                result = trial(server_class, clients, workers, prefix, out) | {"index": index}
                print(f"  {workers}/{processes} trial {index}: {json.dumps(result)}", flush=True)
                results.append(result)
        if syscalls:
            summary["syscalls_per_worker"] = {
                server_class.name: syscalls_per_worker(server_class, clients, workers, prefix)
                for server_class in servers
            }
    finally:
        clients.close()
    summary["trials"] = results
    for server_class in servers:
        mine = [r for r in results if r["server"] == server_class.name]
        summary[server_class.name] = {
            key: statistics.median(r[key] for r in mine)
            for key in (
                "seconds",
                "connect_phase",
                "connect_median",
                "server_cpu",
                "server_user",
                "server_sys",
            )
        } | {"stalls": sum(r["stalls"] for r in mine), "failed": sum(r["failed"] for r in mine)}
    torch = summary["torch"]
    torch_cpu = {r["index"]: r["server_cpu"] for r in results if r["server"] == "torch"}
    for server_class in servers:
        if server_class is not TorchServer:
            side = summary[server_class.name]
            side["ratio_seconds"] = side["seconds"] / torch["seconds"]
            side["ratio_cpu"] = side["server_cpu"] / torch["server_cpu"]
            # Medians hide how often: the trials whose CPU was at most torch's next to it.
            side["trials_cpu_at_most_torch"] = sum(
                1
                for r in results
                if r["server"] == server_class.name and r["server_cpu"] <= torch_cpu[r["index"]]
            )
    summary["ratio_seconds"] = summary["ours"]["ratio_seconds"]
    summary["ratio_cpu"] = summary["ours"]["ratio_cpu"]
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--client", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--sizes", default="4096/8,8192/16", help="WORKERS/PROCESSES,... (default %(default)s)"
    )
    parser.add_argument("--trials", type=int, default=3, help="trials per server (default 3)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON results")
    parser.add_argument(
        "--system-hosts",
        action="store_true",
        help="keep the machine's /etc/hosts for the clients (its DNS stalls included)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also run storm_floor_server.py: the least a Python server on uvloop costs",
    )
    parser.add_argument(
        "--compiled",
        type=Path,
        metavar="DIR",
        help="also run our server from a mypyc build of tp_store installed in DIR "
        "(tp-store's README)",
    )
    parser.add_argument(
        "--syscalls",
        action="store_true",
        help="count each server's system calls per worker in one more storm (strace -c)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="PATH",
        help="sample our server with py-spy during its trials (folded stacks, one file each)",
    )
    args = parser.parse_args(argv)
    if args.client is not None:
        client_main(args.client)
        return 0
    sys.path.insert(0, str(HERE))
    from hostinfo import host_info, versions

    host = host_info()
    sizes = []
    with tempfile.TemporaryDirectory() as scratch:
        prefix = None if args.system_hosts else private_hosts_prefix(Path(scratch))
        if args.compiled:
            CompiledServer.build = args.compiled.resolve()
        print(f"clients' /etc/hosts: {'private' if prefix else 'the machine'}'s", flush=True)
        for size in args.sizes.split(","):
            workers, processes = map(int, size.split("/"))
            print(f"storm of {workers} workers over {processes} processes", flush=True)
            servers: tuple[ServerClass, ...] = (OurServer, TorchServer)
            if args.compiled:
                servers += (CompiledServer,)
            if args.floor:
                servers += (FloorServer,)
            sizes.append(
                run_size(
                    workers,
                    processes,
                    trials=args.trials,
                    prefix=prefix or [],
                    profile=args.profile,
                    servers=servers,
                    syscalls=args.syscalls,
                )
            )
    host["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]
    document = {
        "benchmark": "storm_bench",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "host": host,
        "versions": versions(("ours", "torch"))
        | ({"tp_store (mypyc build)": str(args.compiled)} if args.compiled else {}),
        "private_hosts": prefix is not None,
        "sizes": sizes,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(
        "| workers / processes | ours (s) | torch (s) | ours/torch | connect phase ours / torch "
        "(s) | server CPU ours / torch (s) | CPU ratio | DNS stalls ours / torch |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for s in sizes:
        ours, torch = s["ours"], s["torch"]
        print(
            f"| {s['workers']} / {s['processes']} | {ours['seconds']:.2f} | {torch['seconds']:.2f}"
            f" | x{s['ratio_seconds']:.2f} | {ours['connect_phase']:.2f} / "
            f"{torch['connect_phase']:.2f} | {ours['server_cpu']:.2f} / {torch['server_cpu']:.2f}"
            f" | x{s['ratio_cpu']:.2f} | {ours['stalls']} / {torch['stalls']} |"
        )
    for s in sizes:
        for name in ("ours", "torch", "ours-mypyc", "floor"):
            if name in s:
                side = s[name]
                against = (
                    f", CPU x{side['ratio_cpu']:.2f} torch's (at most torch's in "
                    f"{side['trials_cpu_at_most_torch']} of {args.trials} trials)"
                    if "ratio_cpu" in side
                    else ""
                )
                print(
                    f"{s['workers']}/{s['processes']} {name}: {side['seconds']:.2f} s, server CPU "
                    f"user {side['server_user']:.3f} + sys {side['server_sys']:.3f} s{against}"
                )
        for name, counts in s.get("syscalls_per_worker", {}).items():
            print(f"{s['workers']}/{s['processes']} {name} syscalls per worker: {counts}")
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
