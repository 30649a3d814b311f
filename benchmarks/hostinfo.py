"""What the benchmarks record about the machine they ran on, and the versions measured.

The benchmarks put :func:`host_info` in their JSON ``host`` field, so the
report (``benchmarks/report.py``) can say which machine the numbers come from.
Everything here is read from ``/proc`` and :mod:`platform`; a field that cannot
be read is ``None``. The rendezvous benchmarks put :func:`versions` in their
``versions`` field.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The distributions whose versions a rendezvous benchmark records, per side.
_DISTRIBUTIONS = {
    "ours": ("tp-store", "tp-rdzv-api", "tp-rdzv-dynamic", "tp-rdzv-etcd"),
    "torch": ("torch",),
}


def cpu_model() -> str | None:
    """The CPU's model name from ``/proc/cpuinfo`` (the first processor's)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or None
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match[1].strip() if match else (platform.processor() or None)


def memory_gib() -> float | None:
    """Total memory in GiB from ``/proc/meminfo``."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    match = re.search(r"^MemTotal:\s+(\d+) kB", text, re.MULTILINE)
    return round(int(match[1]) / 1024**2, 1) if match else None


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (other work on the machine adds noise)."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def time_wait_sockets() -> int | None:
    """TCP sockets in TIME_WAIT now (``/proc/net/sockstat``)."""
    try:
        text = Path("/proc/net/sockstat").read_text()
    except OSError:
        return None
    match = re.search(r"^TCP:.*\btw (\d+)", text, re.MULTILINE)
    return int(match[1]) if match else None


def settle_time_wait(below: int, limit: float) -> str:
    """Wait up to ``limit`` seconds until fewer than ``below`` sockets are in TIME_WAIT.

    A run that closes thousands of connections leaves them there for a minute;
    a run started meanwhile connects slower (the kernel searches a crowded port
    space), whatever the code. Returns what it saw, for the run's record.
    """
    deadline = time.monotonic() + limit
    first = count = time_wait_sockets()
    while count is not None and count >= below and time.monotonic() < deadline:
        time.sleep(1.0)
        count = time_wait_sockets()
    return f"TIME_WAIT sockets: {first} before the run, {count} at its start"


def host_info() -> dict[str, Any]:
    """The machine: CPUs, CPU model, memory, kernel, platform, Python and the load now."""
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "memory_gib": memory_gib(),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "load_average_at_start": load_average(),
    }


def source_commit() -> str:
    """The repository's commit the benchmark ran from (``+changes`` when the tree differs):
    our distributions keep one version number across commits."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", "packages")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit}+changes" if changed else commit


def versions(impls: Sequence[str]) -> dict[str, str]:
    """Python's version, the source commit and the installed versions of the sides
    ``impls`` (ours, torch)."""
    found = {"python": platform.python_version(), "commit": source_commit()}
    for impl in impls:
        for distribution in _DISTRIBUTIONS[impl]:
            try:
                found[distribution] = importlib.metadata.version(distribution)
            except importlib.metadata.PackageNotFoundError:
                found[distribution] = "not installed"
    return found
