"""Shared test setup for tp-rdzv-dynamic."""

from __future__ import annotations

import socket
import sys
import threading
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
from handler_threads import (  # noqa: E402
    make_handler,
    recorded_thread_deaths,
    running_server,
    stop_handler,
)

from tp_rdzv_dynamic import DynamicRendezvousHandler  # noqa: E402
from tp_store import TCPStore  # noqa: E402


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


@pytest.fixture
def server() -> Iterator[TCPStore]:
    """A real TCPStore server on loopback."""
    with running_server() as master:
        yield master


@pytest.fixture
def make_node(server: TCPStore) -> Iterator[Callable[..., DynamicRendezvousHandler]]:
    """``make_node(min, max, **options)``: a handler on its own connection to ``server``.

    The options are :func:`handler_threads.make_handler`'s; every handler's
    threads are stopped after the test.
    """
    handlers: list[DynamicRendezvousHandler] = []

    def make(*args: Any, **kwargs: Any) -> DynamicRendezvousHandler:
        handler = make_handler(server.port, *args, **kwargs)
        handlers.append(handler)
        return handler

    yield make
    for handler in handlers:
        stop_handler(handler)


@pytest.fixture
def thread_deaths() -> Iterator[list[threading.ExceptHookArgs]]:
    """The threads that die of an exception during the test (the list stays empty)."""
    deaths: list[threading.ExceptHookArgs] = []
    with recorded_thread_deaths(deaths):
        yield deaths
