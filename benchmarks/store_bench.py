#!/usr/bin/env python3
"""Benchmark tp_store's TCPStore against PyTorch's, in one run.

"ours" is tp_store's client talking to tp_store's standalone server
(``python -m tp_store``); "torch" is ``torch.distributed.TCPStore``'s client
talking to a torch libuv master that runs alone in another process. Every
server runs in its own process, so client and server never share a GIL.

Scenarios:
Each scenario runs for ours and torch back to back, so both see the same
background load; the single-client calls interleave the two implementations
within every round.

1. single-client calls per second (best of a few rounds of about a second
   each, the operations and implementations interleaved): get, add, compare_set, set (torch's set
   does not wait for a reply, so this is what the call costs: sends that are
   only throttled once the socket buffer fills), and set+get (a set confirmed
   by a get of the same key);
2. aggregate add/s of many client processes hammering one counter;
3. a connection storm: N clients (over a few processes, each creating its
   clients from one thread per client) connect, ADD a counter, and WAIT for a
   flag key the N-th client sets; the time from the start signal until every
   client is released;
4. server RSS (VmRSS) with many idle connections (VALIDATE + PING done),
   absolute and as a delta over the same server after one warm-up connection.

Results are printed as a table (with ours/torch ratios) and written as JSON.
Run ``python benchmarks/store_bench.py --help`` for the knobs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import platform
import queue
import re
import resource
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

from hostinfo import host_info, load_average
from metrics import Metric, format_table
from store_matrix import TORCH_SERVER, MatrixConfig, format_matrix, run_matrix

IMPLS = ("ours", "torch")
HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "store_bench.json"
REPO = HERE.parent
LISTENING = re.compile(r"^listening on (?:\[(?P<v6>[^\]]+)\]|(?P<v4>[^:]+)):(?P<port>\d+)$")
VALIDATE = b"\x00" + struct.pack("<I", 0x3C85F7CE)
PING = 13


class StoreClient(Protocol):
    """The part of the store API the benchmark uses (both clients have it)."""

    def set(self, key: str, value: str) -> None: ...
    def get(self, key: str) -> bytes: ...
    def add(self, key: str, amount: int) -> int: ...
    def compare_set(self, key: str, expected: str, desired: str) -> bytes: ...
    def wait(self, keys: list[str]) -> None: ...


@dataclass
class Config:
    """The sizes of every scenario."""

    round_seconds: float = 1.0
    rounds: int = 5
    add_processes: int = 32
    add_seconds: float = 3.0
    storm_sizes: tuple[int, ...] = (100, 1000)
    storm_processes: int = 4
    idle_connections: int = 1000
    skip: set[str] = field(default_factory=set)  # "impl:scenario" names to skip
    timeout: float = 600.0


# -- servers and clients ----------------------------------------------------------


def child_env() -> dict[str, str]:
    """Environment of every child: quiet torch, and tp_store importable."""
    env = dict(os.environ)
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    src = REPO / "packages" / "tp-store" / "src"
    paths = [str(src)] if src.is_dir() else []
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).strip(os.pathsep)
    return env


@dataclass
class Server:
    """A store server process and its address."""

    impl: str
    proc: subprocess.Popen[str]
    host: str
    port: int

    def rss_kib(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        if match is None:
            raise RuntimeError(f"no VmRSS for pid {self.proc.pid}")
        return int(match[1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(impl: str, timeout: float) -> Server:
    """Start ``impl``'s server on an ephemeral port; wait for its banner line."""
    if impl == "ours":
        command = [sys.executable, "-m", "tp_store", "--host", "127.0.0.1", "--port", "0"]
    else:
        command = [sys.executable, str(TORCH_SERVER)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=child_env())
    stdout = proc.stdout
    assert stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=min(timeout, 120)).strip()
    except queue.Empty:
        proc.kill()
        raise RuntimeError(f"{impl} server printed nothing") from None
    match = LISTENING.match(line)
    if match is None:
        proc.kill()
        raise RuntimeError(f"{impl} server printed {line!r}")
    return Server(impl, proc, match["v6"] or match["v4"], int(match["port"]))


def make_client(impl: str, host: str, port: int, timeout: float) -> StoreClient:
    """A client of ``impl`` connected to ``host:port``."""
    if impl == "ours":
        from tp_store import TCPStore

        return TCPStore(host, port, timeout=timeout)
    import torch.distributed as dist

    store: StoreClient = dist.TCPStore(
        host, port, is_master=False, timeout=timedelta(seconds=timeout)
    )
    return store


# -- 1. single-client round trips -----------------------------------------------------


def bench_round_trips(impls: Sequence[str], config: Config) -> dict[str, dict[str, float]]:
    """Calls per second of one client per implementation, measured side by side."""
    with contextlib.ExitStack() as stack:
        calls: dict[str, dict[str, Callable[[], object]]] = {}
        drains: dict[str, Callable[[], object]] = {}
        for impl in impls:
            server = stack.enter_context(start_server(impl, config.timeout))
            calls[impl] = _round_trip_calls(
                make_client(impl, server.host, server.port, config.timeout)
            )
            drains[impl] = calls[impl]["get"]
        for impl_calls in calls.values():  # warm-up
            for call in impl_calls.values():
                calls_per_second(call, 0.1)
        rates = {impl: dict.fromkeys(calls[impl], 0.0) for impl in impls}
        # Best of several short rounds, the operations and the implementations
        # interleaved: both see the same background load, and on a shared
        # machine the best window is the closest to what the code can do.
        for _ in range(config.rounds):
            for name in rates[impls[0]]:
                for impl in impls:
                    drains[impl]()  # drain pipelined sets before timing
                    rate = calls_per_second(calls[impl][name], config.round_seconds)
                    rates[impl][name] = max(rates[impl][name], rate)
        for drain in drains.values():
            drain()
    return rates


def _round_trip_calls(client: StoreClient) -> dict[str, Callable[[], object]]:
    client.set("rt/get", "value")
    client.set("rt/cas", "value")
    return {
        "get": lambda: client.get("rt/get"),
        "add": lambda: client.add("rt/add", 1),
        "compare_set": lambda: client.compare_set("rt/cas", "value", "value"),
        "set": lambda: client.set("rt/set", "value"),
        "set+get": lambda: (client.set("rt/sg", "value"), client.get("rt/sg")),
    }


def calls_per_second(call: Callable[[], object], seconds: float) -> float:
    """Call ``call`` repeatedly for about ``seconds``; return the rate."""
    count = 0
    start = time.perf_counter()
    while True:
        for _ in range(50):
            call()
        count += 50
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return count / elapsed


# -- 2. aggregate add throughput ------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """What a client process needs to know (picklable, for spawn)."""

    impl: str
    host: str
    port: int
    timeout: float
    clients: int = 1  # storm: clients of this process
    total: int = 1  # storm: clients of the whole storm
    seconds: float = 0.0  # add: how long to hammer


def _add_worker(job: Job, barrier: Any, results: Any) -> None:
    try:
        client = make_client(job.impl, job.host, job.port, job.timeout)
        client.add("agg/ready", 1)
        barrier.wait(job.timeout)
        count = 0
        deadline = time.monotonic() + job.seconds
        while time.monotonic() < deadline:
            client.add("agg/counter", 1)
            count += 1
        results.put(("ok", count))
    except Exception as exc:
        results.put(("error", repr(exc)))


def bench_concurrent_add(impl: str, server: Server, config: Config) -> float:
    """Aggregate add/s of ``add_processes`` client processes, one client each."""
    ctx = multiprocessing.get_context("spawn")
    procs = config.add_processes
    barrier = ctx.Barrier(procs + 1)
    results = ctx.Queue()
    job = Job(impl, server.host, server.port, config.timeout, seconds=config.add_seconds)
    args = (job, barrier, results)
    workers = [ctx.Process(target=_add_worker, args=args, daemon=True) for _ in range(procs)]
    for worker in workers:
        worker.start()
    try:
        barrier.wait(config.timeout)
        answers = [results.get(timeout=config.add_seconds + config.timeout) for _ in workers]
    finally:
        for worker in workers:
            worker.join(5)
            if worker.is_alive():
                worker.kill()
    errors = [detail for status, detail in answers if status == "error"]
    if errors:
        raise RuntimeError(f"{len(errors)} add workers failed, first: {errors[0]}")
    total = sum(int(detail) for _, detail in answers)
    check = make_client(impl, server.host, server.port, config.timeout)
    counted = int(check.get("agg/counter"))
    if counted != total:
        raise RuntimeError(f"counter is {counted}, the workers did {total} adds")
    return total / config.add_seconds


# -- 3. connection storm ---------------------------------------------------------------


def _storm_worker(job: Job, barrier: Any, results: Any) -> None:
    go = threading.Event()
    lock = threading.Lock()
    released: list[float] = []
    errors: list[str] = []
    clients: list[StoreClient] = []

    def one_client() -> None:
        go.wait()
        try:
            client = make_client(job.impl, job.host, job.port, job.timeout)
            with lock:
                clients.append(client)
            if client.add("storm/count", 1) == job.total:
                client.set("storm/go", "1")
            client.wait(["storm/go"])
            now = time.monotonic()
            with lock:
                released.append(now)
        except Exception as exc:
            with lock:
                errors.append(repr(exc))

    threads = [threading.Thread(target=one_client, daemon=True) for _ in range(job.clients)]
    for thread in threads:
        thread.start()
    try:
        barrier.wait(job.timeout)
    except Exception as exc:
        results.put((None, 0, [repr(exc)]))
        return
    go.set()
    for thread in threads:
        thread.join()
    results.put((max(released) if released else None, len(released), errors[:3]))


def bench_storm(impl: str, config: Config, size: int) -> float | None:
    """Seconds until all ``size`` clients are released; None on timeout."""
    ctx = multiprocessing.get_context("spawn")
    procs = min(config.storm_processes, size)
    shares = [size // procs + (1 if i < size % procs else 0) for i in range(procs)]
    with start_server(impl, config.timeout) as server:
        barrier = ctx.Barrier(procs + 1)
        results = ctx.Queue()
        workers = [
            ctx.Process(
                target=_storm_worker,
                args=(
                    Job(impl, server.host, server.port, config.timeout, clients=share, total=size),
                    barrier,
                    results,
                ),
                daemon=True,
            )
            for share in shares
        ]
        for worker in workers:
            worker.start()
        try:
            barrier.wait(config.timeout)  # every worker has imported and started its threads
            start = time.monotonic()
            answers = []
            for _ in workers:
                remaining = start + config.timeout - time.monotonic()
                answers.append(results.get(timeout=max(remaining, 0.1)))
        except (queue.Empty, threading.BrokenBarrierError):
            return None
        finally:
            for worker in workers:
                worker.join(1)
                if worker.is_alive():
                    worker.kill()
    errors = [error for _, _, errs in answers for error in errs]
    done = sum(count for _, count, _ in answers)
    if errors or done != size:
        raise RuntimeError(f"{done}/{size} clients released; errors: {errors[:3]}")
    return max(end for end, _, _ in answers) - start


# -- 4. RSS with idle connections ----------------------------------------------------


def open_idle_connections(server: Server, count: int, timeout: float) -> list[socket.socket]:
    """Open ``count`` connections that did VALIDATE + PING, as a torch client does."""
    deadline = time.monotonic() + timeout
    selector = selectors.DefaultSelector()
    sockets: list[socket.socket] = []
    try:
        for nonce in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.connect_ex((server.host, server.port))
            sockets.append(sock)
            selector.register(sock, selectors.EVENT_WRITE, nonce)
        pending = {}
        while len(pending) < count or selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(pending)}/{count} connections set up in {timeout} s")
            for key, events in selector.select(min(left, 1.0)):
                sock = key.fileobj  # type: ignore[assignment]
                nonce = key.data
                if events & selectors.EVENT_WRITE:
                    error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if error:
                        raise OSError(error, os.strerror(error))
                    # 10 bytes always fit in a fresh socket's send buffer
                    sock.send(VALIDATE + bytes([PING]) + struct.pack("<I", nonce))
                    selector.modify(sock, selectors.EVENT_READ, nonce)
                    pending[nonce] = b""
                else:
                    pending[nonce] += sock.recv(4 - len(pending[nonce]))
                    if len(pending[nonce]) == 4:
                        if struct.unpack("<I", pending[nonce])[0] != nonce:
                            raise RuntimeError("bad PING reply")
                        selector.unregister(sock)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    finally:
        selector.close()
    return sockets


def bench_idle_rss(impl: str, config: Config) -> tuple[float, float]:
    """(RSS KiB with the idle connections, delta KiB over the warmed-up server)."""
    with start_server(impl, config.timeout) as server:
        for sock in open_idle_connections(server, 1, config.timeout):  # warm-up
            sock.close()
        base = server.rss_kib()
        sockets = open_idle_connections(server, config.idle_connections, config.timeout)
        try:
            loaded = server.rss_kib()
        finally:
            for sock in sockets:
                sock.close()
    return float(loaded), float(loaded - base)


# -- driver ---------------------------------------------------------------------------


def run_side_by_side(impls: Sequence[str], config: Config, metrics: dict[str, Metric]) -> None:
    """Every scenario for every implementation, one scenario after the other."""
    clock = [time.monotonic()]

    def record(impl: str, name: str, value: float | None, note: str = "") -> None:
        setattr(metrics[name], impl, value)
        if note:
            metrics[name].notes[impl] = note
        shown = "-" if value is None else f"{value:,.1f}"
        took = time.monotonic() - clock[0]
        clock[0] += took
        print(f"  {impl:5} {name}: {shown} {metrics[name].unit} {note}[{took:.1f} s]", flush=True)

    for impl, rates in bench_round_trips(impls, config).items():
        for name, rate in rates.items():
            record(impl, f"{name} (1 client)", rate)
    for impl in impls:
        with start_server(impl, config.timeout) as server:
            rate = bench_concurrent_add(impl, server, config)
        record(impl, f"add ({config.add_processes} processes)", rate)
    for size in config.storm_sizes:
        name = f"storm {size} clients"
        for impl in impls:
            if f"{impl}:storm{size}" in config.skip:
                record(impl, name, None, "skipped (--quick)")
                continue
            elapsed = bench_storm(impl, config, size)
            timed_out = f"timeout ({config.timeout:g} s)"
            record(impl, name, elapsed, "" if elapsed is not None else timed_out)
    for impl in impls:
        try:
            rss, delta = bench_idle_rss(impl, config)
        except TimeoutError as exc:
            record(impl, f"RSS, {config.idle_connections} idle conns", None, str(exc))
            record(impl, f"RSS delta, {config.idle_connections} idle conns", None, str(exc))
        else:
            record(impl, f"RSS, {config.idle_connections} idle conns", rss / 1024)
            record(impl, f"RSS delta, {config.idle_connections} idle conns", delta / 1024)


def new_metrics(config: Config) -> dict[str, Metric]:
    rows = [
        Metric(f"{op} (1 client)", "ops/s", "higher")
        for op in ("get", "add", "compare_set", "set", "set+get")
    ]
    rows.append(Metric(f"add ({config.add_processes} processes)", "ops/s", "higher"))
    rows += [Metric(f"storm {size} clients", "s", "lower") for size in config.storm_sizes]
    rows.append(Metric(f"RSS, {config.idle_connections} idle conns", "MiB", "lower"))
    rows.append(Metric(f"RSS delta, {config.idle_connections} idle conns", "MiB", "lower"))
    return {row.name: row for row in rows}


def versions(impls: Sequence[str]) -> dict[str, str]:
    found = {"python": platform.python_version()}
    if "ours" in impls:
        import tp_store

        found["tp_store"] = tp_store.__version__
        try:
            import uvloop

            found["uvloop (our server's loop)"] = uvloop.__version__
        except ImportError:
            found["uvloop (our server's loop)"] = "not installed (asyncio loop)"
    if "torch" in impls:
        import torch

        found["torch"] = torch.__version__
    return found


def raise_fd_limit() -> None:
    """Idle connections and storms need a few thousand descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 8192 if hard == resource.RLIM_INFINITY else min(hard, 8192)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts, for smoke testing")
    parser.add_argument("--only", choices=IMPLS, help="run one implementation only")
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds allowed per scenario (storms that take longer are reported as timeouts)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results path")
    parser.add_argument("--rounds", type=int, help="rounds of the single-client calls (best kept)")
    parser.add_argument("--add-processes", type=int, help="processes in the add scenario")
    parser.add_argument("--storm-processes", type=int, help="processes sharing a storm")
    parser.add_argument("--idle", type=int, help="idle connections for the RSS scenario")
    parser.add_argument(
        "--compiled",
        type=Path,
        help="a directory holding a mypyc build of tp_store: the matrix measures it too",
    )
    parser.add_argument("--matrix-repetitions", type=int, help="repetitions of the matrix")
    parser.add_argument("--matrix-processes", type=int, help="processes of the matrix aggregate")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--no-matrix", action="store_true", help="skip the client x server matrix")
    which.add_argument("--matrix-only", action="store_true", help="the matrix only")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    os.environ["PYTHONPATH"] = child_env()["PYTHONPATH"]  # for spawned clients too
    sys.path[:0] = [p for p in os.environ["PYTHONPATH"].split(os.pathsep) if p]
    raise_fd_limit()
    config = Config(timeout=args.timeout)
    if args.quick:
        config.round_seconds = 0.3
        config.rounds = 3
        config.add_processes = 4
        config.add_seconds = 1.0
        config.idle_connections = 200
        config.skip.add("torch:storm1000")
    if args.rounds:
        config.rounds = args.rounds
    if args.add_processes:
        config.add_processes = args.add_processes
    if args.storm_processes:
        config.storm_processes = args.storm_processes
    if args.idle:
        config.idle_connections = args.idle
    impls = [args.only] if args.only else list(IMPLS)
    matrix_config = MatrixConfig(compiled=args.compiled, timeout=args.timeout)
    if args.quick:
        matrix_config.repetitions = 3
        matrix_config.seconds = 0.2
        matrix_config.aggregate_seconds = 0.5
        matrix_config.processes = 4
    if args.matrix_repetitions:
        matrix_config.repetitions = args.matrix_repetitions
    if args.matrix_processes:
        matrix_config.processes = args.matrix_processes

    metrics = new_metrics(config) if not args.matrix_only else {}
    host = host_info()
    started = time.monotonic()
    matrix = None
    if not args.no_matrix and not args.only:  # the matrix needs both sides
        print("running the client x server matrix ...", flush=True)
        matrix = run_matrix(matrix_config)
    if metrics:
        print(f"running {' and '.join(impls)}, side by side ...", flush=True)
        run_side_by_side(impls, config, metrics)
    if matrix is not None:
        print()
        print(format_matrix(matrix))
    if metrics:
        print()
        print(format_table(list(metrics.values())))

    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": host | {"load_average_at_end": load_average()},
        "versions": versions(impls),
        "quick": args.quick,
        "config": {k: v for k, v in asdict(config).items() if k != "skip"}
        | {"skipped": sorted(config.skip)},
        "seconds": round(time.monotonic() - started, 1),
        "metrics": [m.to_json() for m in metrics.values()],
    }
    if matrix is not None:
        report["matrix"] = matrix
        if args.compiled:
            report["versions"]["tp_store (mypyc build)"] = str(args.compiled)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nsaved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
