"""Shared test setup for tp-rdzv-dynamic."""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Tests are imported with --import-mode=importlib, which leaves sys.path alone;
# this lets the test modules import their helper modules (dynamic_node).
_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

import dynamic_node  # noqa: E402


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (at the time of asking)."""
    return _free_port()


@pytest.fixture
def spawn_node() -> Iterator[Callable[..., dynamic_node.NodeProcess]]:
    """Start node processes (``dynamic_node.py``); every one is gone after the test.

    ``spawn_node(name, spec, env=None)`` returns a :class:`dynamic_node.NodeProcess`
    at once, without waiting for its ``ready`` line.
    """
    fleet = dynamic_node.NodeFleet()
    yield fleet.spawn
    fleet.close()
