"""Fixtures of the interop suite; the machinery is in ``interop_support.py``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch  # the peer of every test: the interop session installs torch==2.13.0

# The suite's helper module sits next to this file; test modules import it.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from interop_support import OurServer, WorkerPool, start_our_server


def pytest_report_header() -> str:
    return f"interop peer: torch {torch.__version__}"


@pytest.fixture
def our_server() -> Iterator[OurServer]:
    """A fresh server of ours per test (so key counts start at zero)."""
    server = start_our_server()
    try:
        yield server
        # The server must have survived everything the test threw at it.
        server.assert_alive()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def worker_pool() -> Iterator[WorkerPool]:
    pool = WorkerPool()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def workers(worker_pool: WorkerPool) -> Iterator[WorkerPool]:
    """The worker pool, with every torch store dropped after the test."""
    try:
        yield worker_pool
    finally:
        worker_pool.reset()
