"""What the benchmarks record about the machine they ran on.

Both benchmarks put :func:`host_info` in their JSON ``host`` field, so the
report (``benchmarks/report.py``) can say which machine the numbers come from.
Everything here is read from ``/proc`` and :mod:`platform`; a field that cannot
be read is ``None``.
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path
from typing import Any


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
