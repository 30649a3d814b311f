"""Fixtures: the installed ``tp-rdzv`` command in subprocesses, and a store."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Tests are imported with --import-mode=importlib, which leaves sys.path alone.
_TESTS = str(Path(__file__).parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from cli_support import Command  # noqa: E402


@pytest.fixture
def tp_rdzv() -> Iterator[Callable[..., Command]]:
    """``tp_rdzv(*args, sigint_ignored=False)``: start the command; each is stopped at the end."""
    started: list[Command] = []

    def start(*args: str, sigint_ignored: bool = False) -> Command:
        command = Command(list(args), sigint_ignored=sigint_ignored)
        started.append(command)
        return command

    yield start
    for command in started:
        command.stop()


@pytest.fixture
def store(tp_rdzv: Callable[..., Command]) -> str:
    """A standalone ``tp-rdzv store`` on a free loopback port; its endpoint."""
    server = tp_rdzv("store", "--host", "127.0.0.1", "--port", "0", "--json")
    ready = server.event()
    assert ready["event"] == "listening"
    return str(ready["endpoint"])
