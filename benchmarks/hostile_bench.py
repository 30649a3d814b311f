#!/usr/bin/env python3
"""What hostile store values cost their readers, and how fast Ctrl-C stops an operator.

For each hostile value of issue 29 at PyTorch's state key of a run on our
store server (in this process): the CPU time and peak memory of decoding it
in this process, and the wall time of a real ``tp-rdzv status`` and
``tp-rdzv close`` process against it (start to exit, Python's start
included), with its exit code and the lines it wrote to stderr. Then the time
from SIGINT to exit of ``status`` waiting on a store that never answers, and
of ``status`` signalled at several moments after its start (importing,
connecting, reading, decoding).

``python benchmarks/hostile_bench.py [--repeat 3] [--out PATH]``
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import pickle
import signal
import socket
import statistics
import subprocess
import sysconfig
import time
import tracemalloc
from pathlib import Path
from typing import Any

from hostinfo import host_info, load_average
from metrics import write_results

from tp_rdzv_api import RendezvousStateError
from tp_rdzv_dynamic.testing import hash_bomb
from tp_rdzv_dynamic.torch_compat.torch_state import decode_torch_state
from tp_store import TCPStore

TP_RDZV = str(Path(sysconfig.get_path("scripts")) / "tp-rdzv")
RESULTS = Path(__file__).parent / "results" / "hostile_bench.json"


VALUES = {
    "hash bomb, 64 levels (1.5 KB)": hash_bomb(64),
    "EMPTY_SET x 6,000,000 (8 MB)": base64.b64encode(
        pickle.PROTO + b"\x04" + pickle.EMPTY_SET * 6_000_000
    ),
    "EMPTY_SET x 700,000 (in the size bound)": base64.b64encode(
        pickle.PROTO + b"\x04" + pickle.EMPTY_SET * 700_000
    ),
}


def decode_cost(value: bytes) -> dict[str, float]:
    tracemalloc.start()
    started = time.process_time()
    with contextlib.suppress(RendezvousStateError):
        decode_torch_state(value, "the key")
    seconds = time.process_time() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"cpu_s": round(seconds, 4), "peak_mib": round(peak / 2**20, 2)}


def run_command(args: list[str]) -> dict[str, Any]:
    started = time.monotonic()
    result = subprocess.run(
        [TP_RDZV, *args], capture_output=True, text=True, timeout=120, check=False
    )
    return {
        "wall_s": time.monotonic() - started,
        "rc": result.returncode,
        "stderr_lines": len(result.stderr.splitlines()),
    }


def interrupt_after(args: list[str], ready: Any) -> dict[str, Any]:
    """Start ``tp-rdzv args``, call ``ready()`` (what the signal waits for), send
    SIGINT; the seconds from the signal to the exit."""
    process = subprocess.Popen([TP_RDZV, *args], stderr=subprocess.PIPE, text=True)
    try:
        ready()
        sent = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
        return {
            "exit_after_sigint_s": round(time.monotonic() - sent, 3),
            "rc": process.returncode,
            "stderr_lines": len(err.splitlines()),
        }
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    options = parser.parse_args()
    document: dict[str, Any] = {"machine": host_info(), "values": {}, "sigint": {}}
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=30)
    endpoint = f"127.0.0.1:{server.port}"
    try:
        for index, (name, value) in enumerate(VALUES.items()):
            run_id = f"hostile{index}"
            server.set(f"torch.rendezvous.{run_id}", value)
            row: dict[str, Any] = {"decode": decode_cost(value)}
            for command in ("status", "close"):
                runs = [
                    run_command([command, "--endpoint", endpoint, "--run-id", run_id])
                    for _ in range(options.repeat)
                ]
                row[command] = {
                    "median_wall_s": round(statistics.median(r["wall_s"] for r in runs), 3),
                    "rc": sorted({r["rc"] for r in runs}),
                    "max_stderr_lines": max(r["stderr_lines"] for r in runs),
                    "load_average": load_average(),
                }
            document["values"][name] = row
            print(name, row, flush=True)
        with socket.create_server(("127.0.0.1", 0)) as silent:
            silent.settimeout(60)
            port = silent.getsockname()[1]
            accepted: list[socket.socket] = []
            document["sigint"]["awaiting a store that never answers"] = interrupt_after(
                ["status", "--endpoint", f"127.0.0.1:{port}", "--run-id", "x", "--timeout", "600"],
                lambda: accepted.append(silent.accept()[0]),
            )
            for connection in accepted:
                connection.close()
        for delay in (0.1, 0.3, 0.6, 1.0):
            document["sigint"][f"{delay} s after the start (flood of sets)"] = interrupt_after(
                ["status", "--endpoint", endpoint, "--run-id", "hostile2"],
                lambda delay=delay: time.sleep(delay),
            )
        for name, row in document["sigint"].items():
            print("SIGINT,", name, row, flush=True)
    finally:
        server.close()
    document["load_average_at_end"] = load_average()
    write_results(options.out, document)


if __name__ == "__main__":
    main()
