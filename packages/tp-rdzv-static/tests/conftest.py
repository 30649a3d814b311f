"""Shared test setup: ``static_workers`` importable here and in spawned children; free ports."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

# Tests are imported with --import-mode=importlib, which leaves sys.path alone;
# spawned children copy sys.path, so this also lets them import static_workers.
_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (at the time of asking)."""
    return _free_port()
