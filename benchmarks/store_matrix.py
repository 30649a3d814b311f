#!/usr/bin/env python3
"""The client x server matrix of ``store_bench.py``: every client against every server.

Servers, each alone in its own process: torch's TCPStore master (libuv), ours
(``python -m tp_store``) on asyncio's loop and ours on uvloop. Clients: torch's
C++ ``TCPStore`` (it costs the server's measurement little) and ours. With
``--compiled DIR`` (a mypyc build of tp_store installed there, see the tp-store
README) ours-compiled joins both sides, so the two builds are measured in one run.

Workloads: sequential ``add`` and sequential ``get`` by one client, and the
aggregate ``add`` rate of many client processes (16 by default) on one counter.
Every client is a worker process of this script, started once, which keeps one
connection per server and runs what the driver tells it on stdin for a window
that starts at a given ``time.monotonic()`` (one clock for all processes), so
the many-process windows overlap. Each repetition measures every (workload,
client, server) cell once, in an order rotated from one repetition to the
next; the table keeps each cell's median over the repetitions. Besides the
rate, each cell records the CPU seconds per call of the server process
(``/proc/PID/task/*/schedstat``, all its threads) and of the client processes
(``time.process_time``): load on a shared machine disturbs those less than
wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from hostinfo import load_average

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SOURCE = REPO / "packages" / "tp-store" / "src"
TORCH_SERVER = HERE / "torch_store_server.py"
LISTENING = re.compile(r"^listening on (?:\[(?P<v6>[^\]]+)\]|(?P<v4>[^:]+)):(?P<port>\d+)$")
# ``python -m tp_store`` with uvloop made unimportable, so it serves on asyncio's loop.
ASYNCIO_MAIN = (
    "import sys; sys.modules['uvloop'] = None; from tp_store.__main__ import main; sys.exit(main())"
)
GET_KEY = "matrix/get"
ADD_KEY = "matrix/add"


@dataclass(frozen=True)
class Side:
    """A client or a server of the matrix and where its tp_store comes from."""

    name: str  # short, for the JSON
    label: str  # for tables
    impl: str  # "torch" or "ours"
    path: Path | None = None  # tp_store's directory (PYTHONPATH), None for torch
    loop: str = ""  # servers of ours: "asyncio" or "uvloop"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        if self.path is not None:
            env["PYTHONPATH"] = str(self.path)
        return env


@dataclass(frozen=True)
class Workload:
    name: str
    label: str
    processes: int  # client processes at once
    call: str  # "add" or "get"
    key: str


@dataclass
class MatrixConfig:
    repetitions: int = 7
    seconds: float = 0.5  # one client's window
    aggregate_seconds: float = 1.0  # the many processes' window
    processes: int = 16
    lead: float = 1.0  # seconds between the order and the start of a many-process window
    compiled: Path | None = None
    timeout: float = 600.0


def sides(config: MatrixConfig) -> tuple[list[Side], list[Side]]:
    """(clients, servers) of the matrix."""
    clients = [Side("torch", "torch", "torch"), Side("ours", "ours", "ours", SOURCE)]
    servers = [
        Side("torch", "torch", "torch"),
        Side("ours-asyncio", "ours (asyncio)", "ours", SOURCE, "asyncio"),
        Side("ours-uvloop", "ours (uvloop)", "ours", SOURCE, "uvloop"),
    ]
    if config.compiled is not None:
        path = config.compiled.resolve()
        clients.append(Side("ours-mypyc", "ours (mypyc)", "ours", path))
        servers += [
            Side("ours-mypyc-asyncio", "ours mypyc (asyncio)", "ours", path, "asyncio"),
            Side("ours-mypyc-uvloop", "ours mypyc (uvloop)", "ours", path, "uvloop"),
        ]
    return clients, servers


def workloads(config: MatrixConfig) -> list[Workload]:
    return [
        Workload("add", "sequential add, 1 client", 1, "add", ADD_KEY),
        Workload("get", "sequential get, 1 client", 1, "get", GET_KEY),
        Workload(
            "aggregate-add",
            f"aggregate add, {config.processes} processes",
            config.processes,
            "add",
            ADD_KEY,
        ),
    ]


# -- processes -----------------------------------------------------------------------


class Lines:
    """The stdout lines of a child process, read by a thread so reads can time out."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._queue: queue.Queue[str] = queue.Queue()
        stdout = proc.stdout
        assert stdout is not None

        def pump() -> None:
            for line in stdout:
                self._queue.put(line)
            self._queue.put("")

        threading.Thread(target=pump, daemon=True).start()

    def next(self, timeout: float, who: str) -> str:
        try:
            line = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{who} said nothing within {timeout:g} s") from None
        if not line:
            raise RuntimeError(f"{who} exited")
        return line.strip()


@dataclass
class ServerProcess:
    side: Side
    proc: subprocess.Popen[str]
    address: str  # host:port

    def cpu_seconds(self) -> float:
        """CPU seconds of all the process's threads, to the nanosecond (schedstat)."""
        total = 0
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that just ended
                total += int((task / "schedstat").read_text().split()[0])
        return total / 1e9

    def mapped(self) -> str:
        return Path(f"/proc/{self.proc.pid}/maps").read_text()


def start_server(side: Side, timeout: float) -> ServerProcess:
    """``side``'s server on an ephemeral loopback port; checks it runs the loop and build
    it should."""
    if side.impl == "torch":
        command = [sys.executable, str(TORCH_SERVER)]
    else:
        args = ["--host", "127.0.0.1", "--port", "0"]
        main = ["-m", "tp_store"] if side.loop == "uvloop" else ["-c", ASYNCIO_MAIN]
        command = [sys.executable, *main, *args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=side.env())
    line = Lines(proc).next(min(timeout, 120), f"the {side.label} server")
    match = LISTENING.match(line)
    if match is None:
        proc.kill()
        raise RuntimeError(f"the {side.label} server printed {line!r}")
    server = ServerProcess(side, proc, f"{match['v4'] or match['v6']}:{match['port']}")
    if side.impl == "ours":
        _check_build(server)
    return server


def _check_build(server: ServerProcess) -> None:
    """The server runs the loop and the tp_store build its side names (from its mappings)."""
    maps = server.mapped()
    side = server.side
    if ("uvloop" in maps) != (side.loop == "uvloop"):
        raise RuntimeError(f"the {side.label} server does not run on {side.loop}")
    compiled = side.path is not None and side.path != SOURCE
    if compiled and str(side.path) not in maps:
        raise RuntimeError(f"the {side.label} server loaded no compiled module from {side.path}")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Worker:
    """A client process of this script (see :func:`serve_worker`)."""

    def __init__(self, side: Side, index: int, timeout: float) -> None:
        self.side = side
        self.name = f"{side.label} client {index}"
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", side.impl],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=side.env(),
        )
        self.lines = Lines(self.proc)
        self.timeout = timeout

    def ready(self) -> None:
        """Wait for the worker's banner; check it imported the tp_store build it should."""
        banner = json.loads(self.lines.next(self.timeout, self.name))
        module = str(banner.get("protocol_module", ""))
        if self.side.path is not None and not module.startswith(str(self.side.path)):
            raise RuntimeError(f"{self.name} imported tp_store from {module}")
        if self.side.path is not None and self.side.path != SOURCE and module.endswith(".py"):
            raise RuntimeError(f"{self.name} imported the pure-Python {module}")

    def order(self, **command: Any) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        stdin.write(json.dumps(command) + "\n")
        stdin.flush()

    def answer(self, timeout: float) -> dict[str, Any]:
        answer: dict[str, Any] = json.loads(self.lines.next(timeout, self.name))
        if "error" in answer:
            raise RuntimeError(f"{self.name}: {answer['error']}")
        return answer


# -- the worker side -------------------------------------------------------------------


def make_client(impl: str, address: str, timeout: float) -> Any:
    host, _, port = address.rpartition(":")
    if impl == "torch":
        from torch.distributed import TCPStore as TorchStore  # type: ignore[attr-defined]

        return TorchStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout))
    from tp_store import TCPStore

    return TCPStore(host, int(port), timeout=timeout)


def serve_worker(impl: str) -> int:
    """A client process: run each window the driver orders on stdin, answer on stdout."""
    clients: dict[str, Any] = {}
    banner: dict[str, Any] = {"pid": os.getpid()}
    if impl == "ours":
        # The client's codec: a compiled module of the mypyc build (protocol/ is a package).
        import tp_store.protocol.client_session

        banner["protocol_module"] = tp_store.protocol.client_session.__file__
    print(json.dumps(banner), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "quit":
            break
        try:
            if command["op"] == "connect":
                for address in command["servers"]:
                    clients[address] = make_client(impl, address, command["timeout"])
                    clients[address].set(GET_KEY, "value")
                print(json.dumps({"connected": len(clients)}), flush=True)
                continue
            client = clients[command["server"]]
            answer: dict[str, Any]
            if command["op"] == "read":
                answer = {"value": int(client.get(command["key"]))}
            else:
                answer = run_window(client, command["call"], command["key"], command)
        except Exception as exc:
            answer = {"error": repr(exc)}
        print(json.dumps(answer), flush=True)
    return 0


def run_window(client: Any, call_name: str, key: str, command: dict[str, Any]) -> dict[str, Any]:
    """Call ``client.<call_name>(key ...)`` for ``seconds`` from ``start`` (from now if this
    process got the order late: a loaded machine may delay it)."""
    call: Callable[[], object] = (
        (lambda: client.add(key, 1)) if call_name == "add" else (lambda: client.get(key))
    )
    start = float(command["start"])
    wait = start - time.monotonic()
    if wait > 0:
        time.sleep(wait)  # a deadline shared with the other processes, not an event
    began = time.monotonic()
    end = began + float(command["seconds"])
    cpu = time.process_time()
    count = 0
    now = began
    while now < end:
        for _ in range(20):
            call()
        count += 20
        now = time.monotonic()
    return {"count": count, "cpu": time.process_time() - cpu, "began": began, "ended": now}


# -- the driver ------------------------------------------------------------------------


@dataclass
class Cell:
    """One (workload, client, server) of the matrix: a sample per repetition."""

    workload: str
    client: str
    server: str
    rates: list[float] = field(default_factory=list)
    server_cpu: list[float] = field(default_factory=list)  # seconds per call
    client_cpu: list[float] = field(default_factory=list)  # seconds per call, all clients
    late: float = 0.0  # the latest start of a client process after the shared one, seconds

    def to_json(self) -> dict[str, Any]:
        def median(values: list[float]) -> float | None:
            return statistics.median(values) if values else None

        return {
            "workload": self.workload,
            "client": self.client,
            "server": self.server,
            "rate": median(self.rates),
            "best_rate": max(self.rates) if self.rates else None,
            "server_cpu_us": _micro(median(self.server_cpu)),
            "client_cpu_us": _micro(median(self.client_cpu)),
            "rates": [round(rate, 1) for rate in self.rates],
            "server_cpu_us_each": [round(cpu * 1e6, 2) for cpu in self.server_cpu],
            "latest_start_s": round(self.late, 3),
        }


def _micro(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e6, 2)


def measure(
    cell: Cell,
    workload: Workload,
    server: ServerProcess,
    workers: Sequence[Worker],
    c: MatrixConfig,
) -> int:
    """One window of ``cell``; returns the calls made (so the driver can check the counter)."""
    seconds = c.seconds if workload.processes == 1 else c.aggregate_seconds
    lead = 0.05 if workload.processes == 1 else c.lead
    before = server.cpu_seconds()
    start = time.monotonic() + lead
    for worker in workers:
        worker.order(
            op="run",
            server=server.address,
            call=workload.call,
            key=workload.key,
            start=start,
            seconds=seconds,
            timeout=c.timeout,
        )
    answers = [worker.answer(lead + seconds + c.timeout) for worker in workers]
    used = server.cpu_seconds() - before
    calls = sum(int(answer["count"]) for answer in answers)
    # From the first process's start to the last one's end: staggered starts count against.
    span = max(float(a["ended"]) for a in answers) - min(float(a["began"]) for a in answers)
    cell.rates.append(calls / span)
    cell.server_cpu.append(used / calls)
    cell.client_cpu.append(sum(float(answer["cpu"]) for answer in answers) / calls)
    cell.late = max(cell.late, *(float(answer["began"]) - start for answer in answers))
    return calls


def run_matrix(config: MatrixConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure the whole matrix; the JSON-ready result."""
    clients, servers = sides(config)
    jobs = workloads(config)
    running: list[ServerProcess] = []
    pools: dict[str, list[Worker]] = {}
    try:
        for side in servers:
            running.append(start_server(side, config.timeout))
        for side in clients:
            pools[side.name] = [Worker(side, i, config.timeout) for i in range(config.processes)]
        addresses = [server.address for server in running]
        for pool in pools.values():
            for worker in pool:
                worker.ready()
                worker.order(op="connect", servers=addresses, timeout=config.timeout)
            for worker in pool:
                worker.answer(config.timeout)
        cells = {
            (job.name, client.name, server.side.name): Cell(job.name, client.name, server.side.name)
            for job in jobs
            for client in clients
            for server in running
        }
        pairs = [(client, server) for client in clients for server in running]
        adds = {server.side.name: 0 for server in running}
        loads = []
        for job in jobs:  # warm-up: connections made, code paths run once
            for client, server in pairs:
                warm = Cell(job.name, client.name, server.side.name)
                workers = pools[client.name][: job.processes]
                calls = measure(warm, job, server, workers, config)
                adds[server.side.name] += calls if job.call == "add" else 0
        for repetition in range(config.repetitions):
            loads.append(load_average())
            shift = repetition % len(pairs)
            for job in jobs:
                for client, server in pairs[shift:] + pairs[:shift]:
                    cell = cells[(job.name, client.name, server.side.name)]
                    workers = pools[client.name][: job.processes]
                    calls = measure(cell, job, server, workers, config)
                    adds[server.side.name] += calls if job.call == "add" else 0
            log(f"  matrix repetition {repetition + 1}/{config.repetitions} (load {loads[-1]})")
        check_counters(pools[clients[0].name][0], running, adds, config.timeout)
    finally:
        for pool in pools.values():
            for worker in pool:
                if worker.proc.poll() is None:
                    worker.order(op="quit")
        for pool in pools.values():
            for worker in pool:
                stop(worker.proc)
        for server in running:
            stop(server.proc)
    return {
        "clients": [{"name": side.name, "label": side.label} for side in clients],
        "servers": [{"name": side.name, "label": side.label} for side in servers],
        "workloads": [
            {"name": job.name, "label": job.label, "processes": job.processes} for job in jobs
        ],
        "repetitions": config.repetitions,
        "seconds": config.seconds,
        "aggregate_seconds": config.aggregate_seconds,
        "load_average_per_repetition": loads,
        "cells": [cell.to_json() for cell in cells.values()],
    }


def check_counters(
    worker: Worker, servers: Sequence[ServerProcess], adds: dict[str, int], timeout: float
) -> None:
    """Every server's counter holds every add the clients made to it."""
    for server in servers:
        worker.order(op="read", server=server.address, key=ADD_KEY, timeout=timeout)
        value = int(worker.answer(timeout)["value"])
        if value != adds[server.side.name]:
            raise RuntimeError(
                f"the {server.side.label} server's counter is {value}, "
                f"the clients made {adds[server.side.name]} adds"
            )


# -- tables ----------------------------------------------------------------------------

BASE = ("torch", "torch")  # the (client, server) every other is compared with: all torch


@dataclass
class MatrixView:
    """A matrix result of :func:`run_matrix` read back from its JSON, for tables and plots."""

    result: dict[str, Any]

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """Every (client, server), clients first."""
        servers = [side["name"] for side in self.result["servers"]]
        return [(side["name"], server) for side in self.result["clients"] for server in servers]

    @property
    def workloads(self) -> list[dict[str, str]]:
        return list(self.result["workloads"])

    def label(self, pair: tuple[str, str]) -> str:
        labels = {s["name"]: s["label"] for s in self.result["clients"] + self.result["servers"]}
        return f"{labels[pair[0]]} → {labels[pair[1]]}"

    def value(self, workload: str, pair: tuple[str, str], value: str) -> float | None:
        for cell in self.result["cells"]:
            if (cell["workload"], cell["client"], cell["server"]) == (workload, *pair):
                found: float | None = cell.get(value)
                return found
        return None


def matrix_table(result: dict[str, Any], value: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the matrix: a row per workload, a column per client → server.

    ``value`` is ``"rate"`` (calls per second, the median), ``"best_rate"`` (the best
    repetition's), ``"server_cpu_us"`` or ``"client_cpu_us"`` (CPU microseconds per call,
    medians); each cell also shows its ratio to torch → torch.
    """
    view = MatrixView(result)
    header = ["workload", *(view.label(pair) for pair in view.pairs)]
    rows = []
    for job in view.workloads:
        base = view.value(job["name"], BASE, value)
        row = [job["label"]]
        for pair in view.pairs:
            measured = view.value(job["name"], pair, value)
            text = _quantity(measured, value)
            if measured is not None and base and pair != BASE:
                text += f" (x{measured / base:.2f})"
            row.append(text)
        rows.append(row)
    return header, rows


def _quantity(measured: float | None, value: str) -> str:
    if measured is None:
        return "-"
    if not value.endswith("rate"):
        return f"{measured:.1f} us"
    return f"{measured / 1000:.1f}k/s" if measured >= 1000 else f"{measured:.0f}/s"


def format_matrix(result: dict[str, Any]) -> str:
    """The matrix as plain text: rates, then server and client CPU per call."""
    parts = []
    for value, title in (
        ("rate", "calls per second (median)"),
        ("best_rate", "calls per second (best repetition)"),
        ("server_cpu_us", "server CPU per call"),
        ("client_cpu_us", "client CPU per call (all client processes)"),
    ):
        header, rows = matrix_table(result, value)
        parts.append(f"{title}; (xR) is the ratio to torch → torch")
        for row in [header, *rows]:
            parts.append("  " + " | ".join(row))
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", choices=("torch", "ours"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.worker:
        parser.error("run store_bench.py; this module is its matrix")
    return serve_worker(args.worker)


if __name__ == "__main__":
    sys.exit(main())
