"""Shared set-up of the chaos suite: import paths, and the figures in the summary."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Tests are imported with --import-mode=importlib, which leaves sys.path alone;
# this lets them import the harness and tp-rdzv-dynamic's node script.
_HERE = Path(__file__).resolve().parent
for _path in (_HERE, _HERE.parents[1] / "packages" / "tp-rdzv-dynamic" / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import chaos_harness  # noqa: E402


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if chaos_harness.SUMMARY:
        terminalreporter.section("chaos")
        for line in chaos_harness.SUMMARY:
            terminalreporter.write_line(line)
