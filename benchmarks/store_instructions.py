#!/usr/bin/env python3
"""Instructions per call of our store server, or of a store client, counted by callgrind.

Wall and CPU times on a shared machine move with its load; the instructions a
process executes per call do not. The process measured runs alone under
``valgrind --tool=callgrind``; after a warm-up its counters are zeroed
(``callgrind_control --zero``), ``--calls`` calls are made, and the counters
are dumped. Only user-space instructions count: the kernel's share of each
read and write is not in them.

Servers (the default): each variant of ours (on asyncio and on uvloop, and with
``--compiled DIR`` the mypyc build there) is measured, driven by torch's C++
client (which adds nothing to the server's count); compare variants of ours
with it, not ours with torch. Per ``add`` and per ``get``; a ``get`` of torch's
client is two requests (WAIT, then GET).

Clients (``--clients``): a client process (torch's C++ client, ours, and with
``--compiled DIR`` the mypyc build) is measured against torch's server
(``torch_store_server.py``, not under valgrind), per ``add``, ``get`` (WAIT then
GET on torch's server, for both clients) and ``set`` (no reply). Both are
client processes making the same calls from a Python loop, so the counts
compare fairly, apart from the kernel's share.

    python benchmarks/store_instructions.py [--clients] [--calls 2000] [--compiled DIR]

Needs valgrind and torch 2.13; it prints a table and writes nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from store_matrix import (
    ASYNCIO_MAIN,
    LISTENING,
    SOURCE,
    TORCH_SERVER,
    Lines,
    make_client,
    stop,
)

WARM_UP = 300
SERVER_CALLS = ("add", "get")
CLIENT_CALLS = ("add", "get", "set")


def control(command: str, pid: int) -> None:
    """``callgrind_control COMMAND PID``, quietly."""
    subprocess.run(["callgrind_control", command, str(pid)], check=True, capture_output=True)


def listening_port(lines: Lines, who: str, timeout: float) -> int:
    match = LISTENING.match(lines.next(timeout, who))
    if match is None:
        raise RuntimeError(f"{who} printed no address")
    return int(match["port"])


def calls_of(client: object, call: str) -> Callable[[], object]:
    """One ``call`` of ``client`` (torch's TCPStore or ours), as the matrix makes it."""
    if call == "add":
        return lambda: client.add("n", 1)  # type: ignore[attr-defined]
    if call == "get":
        return lambda: client.get("k")  # type: ignore[attr-defined]
    return lambda: client.set("s", "value")  # type: ignore[attr-defined]


@contextmanager
def counted(
    command: Sequence[str], env: dict[str, str], calls: int, result: list[int]
) -> Iterator[subprocess.Popen[str]]:
    """Run ``command`` under callgrind for the body; then append its instructions per
    call (counted between the caller's ``control("--zero")`` and ``control("--dump")``)
    to ``result``."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "callgrind.out"
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        try:
            yield proc
        finally:
            stop(proc)
        dumps = sorted(Path(scratch).glob("callgrind.out*"), key=lambda p: p.stat().st_mtime)
        for dump in dumps:  # the first dump is ours; the last is the exit's
            found = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.MULTILINE)
            if found:
                result.append(int(found[1]) // calls)
                return
    raise RuntimeError("callgrind wrote no counts")


def count_server(path: Path, loop: str, call: str, calls: int, timeout: float) -> int:
    """User-space instructions of our server at ``path`` on ``loop`` per ``call`` of
    torch's client."""
    from torch.distributed import TCPStore as TorchStore  # type: ignore[attr-defined]

    main = ["-m", "tp_store"] if loop == "uvloop" else ["-c", ASYNCIO_MAIN]
    result: list[int] = []
    command = [sys.executable, *main, "--port", "0"]
    with counted(command, dict(os.environ, PYTHONPATH=str(path)), calls, result) as server:
        port = listening_port(Lines(server), "the server under valgrind", timeout)
        client = TorchStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=timeout))
        client.set("k", "value")
        work = calls_of(client, call)
        for _ in range(WARM_UP):
            work()
        control("--zero", server.pid)
        for _ in range(calls):
            work()
        control("--dump", server.pid)
    return result[0]


def count_client(
    impl: str, path: Path | None, address: str, call: str, *, calls: int, timeout: float
) -> int:
    """User-space instructions of a client process (``impl`` "torch" or "ours", from
    ``path``) per ``call`` against the server at ``address``."""
    env = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR")
    if path is not None:
        env["PYTHONPATH"] = str(path)
    command = [sys.executable, __file__, "--client-process", impl, address, call, str(calls)]
    result: list[int] = []
    with counted(command, env, calls, result) as client:
        lines = Lines(client)
        stdin = client.stdin
        assert stdin is not None
        for step in ("--zero", "--dump"):
            if lines.next(timeout, "the client under valgrind") != "ready":
                raise RuntimeError("the client under valgrind did not get ready")
            control(step, client.pid)
            stdin.write("go\n")
            stdin.flush()
    return result[0]


def client_process(impl: str, address: str, call: str, calls: int) -> int:
    """The measured client: warm up, then make ``calls`` calls between two go-aheads
    read from stdin (the driver zeroes the counters before the first, dumps after)."""
    client = make_client(impl, address, 600.0)
    client.set("k", "value")
    work = calls_of(client, call)
    for _ in range(WARM_UP):
        work()
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(calls):
        work()
    print("ready", flush=True)
    sys.stdin.readline()
    return 0


def servers_table(builds: dict[str, Path], calls: int, timeout: float) -> None:
    print("server                     add       get (WAIT + GET)")
    for loop in ("uvloop", "asyncio"):
        for name, path in builds.items():
            add, get = (count_server(path, loop, call, calls, timeout) for call in SERVER_CALLS)
            print(f"{loop + ', ' + name:22} {add:>9,} {get:>9,}", flush=True)


def clients_table(builds: dict[str, Path], calls: int, timeout: float) -> None:
    server = subprocess.Popen(
        [sys.executable, str(TORCH_SERVER)],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR"),
    )
    try:
        address = f"127.0.0.1:{listening_port(Lines(server), 'torch server', timeout)}"
        sides: dict[str, tuple[str, Path | None]] = {"torch": ("torch", None)}
        sides.update({f"ours, {name}": ("ours", path) for name, path in builds.items()})
        print("client (torch server)       add  get (WAIT + GET)       set")
        for name, (impl, path) in sides.items():
            counts = [
                count_client(impl, path, address, call, calls=calls, timeout=timeout)
                for call in CLIENT_CALLS
            ]
            print(f"{name:19} {counts[0]:>9,} {counts[1]:>17,} {counts[2]:>9,}", flush=True)
    finally:
        stop(server)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls counted per variant")
    parser.add_argument("--compiled", type=Path, help="a directory holding a mypyc build")
    parser.add_argument(
        "--clients", action="store_true", help="count client processes, not our servers"
    )
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--client-process", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client_process:
        impl, address, call, calls = args.client_process
        return client_process(impl, address, call, int(calls))
    builds = {"pure Python": SOURCE}
    if args.compiled:
        builds["mypyc"] = args.compiled.resolve()
    table = clients_table if args.clients else servers_table
    table(builds, args.calls, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
