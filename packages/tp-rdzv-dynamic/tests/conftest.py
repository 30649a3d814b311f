"""Shared test setup for tp-rdzv-dynamic."""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
    nodes: list[dynamic_node.NodeProcess] = []

    def spawn(
        name: str, spec: dict[str, Any], env: dict[str, str] | None = None
    ) -> dynamic_node.NodeProcess:
        node = dynamic_node.NodeProcess(name, spec, env)
        nodes.append(node)
        return node

    yield spawn
    # Ask everyone to exit first (idle nodes leave at once), then kill the rest.
    for node in nodes:
        if node.alive():
            with contextlib.suppress(AssertionError):
                node.send("exit")
    deadline = time.monotonic() + 2.0
    for node in nodes:
        node.stop(grace=max(0.0, deadline - time.monotonic()))
