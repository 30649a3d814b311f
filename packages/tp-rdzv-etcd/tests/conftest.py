"""Shared test setup: real etcd clusters started by fixtures.

Without an etcd binary the tests that need one are skipped, except under CI
(``CI=true``), where a missing etcd fails them: CI must never pass without
having run them.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Tests are imported with --import-mode=importlib, which leaves sys.path alone;
# this lets the test modules import their helper modules (etcd_cluster), and
# the multi-process tests the node script of tp-rdzv-dynamic's tests.
_TESTS = Path(__file__).resolve().parent
_DYNAMIC_TESTS = _TESTS.parent.parent / "tp-rdzv-dynamic" / "tests"
for _path in (str(_TESTS), str(_DYNAMIC_TESTS)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from etcd_cluster import SUMMARY, Cluster, MakeCluster, etcd_version, find_etcd  # noqa: E402


def pytest_report_header() -> str:
    binary = find_etcd()
    if binary is None:
        return "etcd: not found (tests marked etcd are skipped, or fail under CI=true)"
    return f"etcd: {etcd_version(binary)} ({binary})"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SUMMARY:
        terminalreporter.section("etcd")
        for line in SUMMARY:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def etcd_binary() -> str:
    """The etcd server binary; skips (fails under CI) when there is none."""
    binary = find_etcd()
    if binary is None:
        message = (
            "no etcd binary: install the Debian package etcd-server "
            "(or point TP_ETCD_BINARY at one)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {message}")
        pytest.skip(message)
    return binary


def _data_root(tmp: Path) -> Path:
    """Where members keep their data: in memory (/dev/shm) when there is one.

    etcd fsyncs its log on every commit; on a CI VM's disk that, not our code,
    would dominate the contended tests.
    """
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="tp-etcd-", dir=shm))
    return tmp


def _cluster(binary: str, size: int, tmp: Path) -> Cluster:
    root = _data_root(tmp)
    cluster = Cluster(binary, size, root)
    cluster.on_stop = lambda: shutil.rmtree(root, ignore_errors=True)
    try:
        cluster.wait_ready()
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="session")
def etcd1(etcd_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A one-member cluster shared by the session (each test uses its own prefix)."""
    cluster = _cluster(etcd_binary, 1, tmp_path_factory.mktemp("etcd1"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def etcd3(etcd_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A three-member cluster shared by the session (each test uses its own prefix)."""
    cluster = _cluster(etcd_binary, 3, tmp_path_factory.mktemp("etcd3"))
    yield cluster
    cluster.stop()


@pytest.fixture
def make_cluster(etcd_binary: str, tmp_path: Path) -> Iterator[MakeCluster]:
    """Fresh clusters of a given size for one test (that kills members)."""
    clusters: list[Cluster] = []

    def make(size: int) -> Cluster:
        cluster = _cluster(etcd_binary, size, tmp_path / f"cluster{len(clusters)}")
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop()
