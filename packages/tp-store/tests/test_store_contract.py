"""One contract, every store: the behaviour of PyTorch's ``c10d::Store``.

The tests live in :mod:`tp_store.testing.contract`, so that other packages run
the same contract on their stores. Here they run against every kind of store
tp-store ships, through the ``harness`` fixture, which also opens further
handles on the same data (a clone in-process, a new client over TCP, a new
``FileStore`` on the same file) so tests can play several users.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
import store_workers

from tp_store import FileStore, HashStore, PrefixStore, Store, TCPStore
from tp_store.testing.contract import TIMEOUT, Harness, StoreContract


def _build(kind: str, tmp_path: Path) -> tuple[Harness, list[Store]]:
    """The harness for ``kind``, and the stores to close after its handles."""
    if kind == "hash":
        hash_store = HashStore(TIMEOUT)
        return Harness(hash_store, hash_store.clone, crosses_processes=False), []
    if kind == "prefix-hash":
        prefixed = PrefixStore("pfx", HashStore(TIMEOUT))
        return Harness(prefixed, prefixed.clone, crosses_processes=False), []
    if kind == "file":
        open_file = functools.partial(FileStore, str(tmp_path / "store"), timeout=TIMEOUT)
        return Harness(open_file(), open_file, crosses_processes=True), []
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    connect = functools.partial(TCPStore, "127.0.0.1", server.port, timeout=TIMEOUT)
    if kind == "tcp":
        return Harness(server, connect, crosses_processes=True), []
    open_prefixed = functools.partial(store_workers.open_prefixed, "pfx", connect)
    return Harness(open_prefixed(), open_prefixed, crosses_processes=True), [server]


@pytest.fixture(params=["hash", "file", "prefix-hash", "tcp", "prefix-tcp"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    built, servers = _build(request.param, tmp_path)
    yield built
    built.close()
    for server in servers:
        server.close()


class TestStoreContract(StoreContract):
    """The contract on tp-store's own stores."""
