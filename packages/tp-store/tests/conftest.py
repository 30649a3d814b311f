"""Shared test setup: make ``store_workers`` importable here and in child processes;
throwaway TLS certificates."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tp_store.server.store_server import ServerThread
from tp_store.testing.tls import TestPKI, make_test_pki

# Tests are imported with --import-mode=importlib, which leaves sys.path alone;
# spawned children copy sys.path, so this also lets them import store_workers.
_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from raw_client import EVENT_LOOPS, server_thread  # noqa: E402


@pytest.fixture(params=EVENT_LOOPS)
def server(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ServerThread]:
    """A fresh server on 127.0.0.1 in a thread, on each event loop (modules with a
    server of another kind define their own ``server``)."""
    with server_thread(request.param, monkeypatch) as thread:
        yield thread


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPKI:
    """Throwaway CA, server and client certificates (made once per session with openssl)."""
    return make_test_pki(tmp_path_factory.mktemp("pki"))
