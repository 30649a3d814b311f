#!/usr/bin/env python3
"""Instructions per request of our store server, counted by valgrind's callgrind.

Wall and CPU times on a shared machine move with its load; the instructions a
server executes per request do not. Each server variant (ours on asyncio and on
uvloop, and with ``--compiled DIR`` the mypyc build there) runs alone under
``valgrind --tool=callgrind``, driven by torch's C++ client (which adds nothing
to the server's count); after a warm-up the counters are zeroed
(``callgrind_control --zero``), the client makes ``--calls`` calls, and the
counters are dumped. Only user-space instructions count: the kernel's share of
each read and write is not in them, so compare variants of ours with it, not
ours with torch. A ``get`` of torch's client is two requests (WAIT, then GET).

    python benchmarks/store_instructions.py [--calls 2000] [--compiled DIR]

Needs valgrind and torch 2.13; it prints a table and writes nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from store_matrix import ASYNCIO_MAIN, LISTENING, SOURCE, Lines

WARM_UP = 300


def control(command: str, pid: int) -> None:
    """``callgrind_control COMMAND PID``, quietly."""
    subprocess.run(["callgrind_control", command, str(pid)], check=True, capture_output=True)


def count(path: Path, loop: str, call: str, calls: int, timeout: float) -> int:
    """User-space instructions of the server at ``path`` on ``loop`` per ``call``."""
    from torch.distributed import TCPStore as TorchStore  # type: ignore[attr-defined]

    main = ["-m", "tp_store"] if loop == "uvloop" else ["-c", ASYNCIO_MAIN]
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "callgrind.out"
        server = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                *main,
                "--port",
                "0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(path)),
        )
        try:
            match = LISTENING.match(Lines(server).next(timeout, "the server under valgrind"))
            if match is None:
                raise RuntimeError("the server under valgrind printed no address")
            client = TorchStore(
                "127.0.0.1",
                int(match["port"]),
                is_master=False,
                timeout=timedelta(seconds=timeout),
            )
            client.set("k", "value")
            work = (lambda: client.add("n", 1)) if call == "add" else (lambda: client.get("k"))
            for _ in range(WARM_UP):
                work()
            control("--zero", server.pid)
            for _ in range(calls):
                work()
            control("--dump", server.pid)
        finally:
            server.terminate()
            server.wait()
        dumps = sorted(Path(scratch).glob("callgrind.out*"), key=lambda p: p.stat().st_mtime)
        for dump in dumps:  # the first dump is ours; the last is the exit's
            found = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.MULTILINE)
            if found:
                return int(found[1]) // calls
    raise RuntimeError("callgrind wrote no counts")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls counted per variant")
    parser.add_argument("--compiled", type=Path, help="a directory holding a mypyc build")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    builds = {"pure Python": SOURCE}
    if args.compiled:
        builds["mypyc"] = args.compiled.resolve()
    print("server                     add       get (WAIT + GET)")
    for loop in ("uvloop", "asyncio"):
        for name, path in builds.items():
            add, get = (
                count(path, loop, call, args.calls, args.timeout) for call in ("add", "get")
            )
            print(f"{loop + ', ' + name:22} {add:>9,} {get:>9,}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
