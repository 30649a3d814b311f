"""Store sessions on tp-store's in-process stores: the contract, and what is theirs alone.

The contract (:mod:`tp_store.testing.session_contract`) runs on every store
that offers sessions; TCPStore runs it in ``test_tcp_sessions.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tp_store import (
    FileStore,
    HashStore,
    Limits,
    PrefixStore,
    Store,
    StoreLimitError,
    UnsupportedOperationError,
)
from tp_store.testing.contract import TIMEOUT, Harness
from tp_store.testing.session_contract import LONG, StoreSessionContract


@pytest.fixture(params=["hash", "prefix-hash"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    store: Store = HashStore(TIMEOUT)
    if request.param == "prefix-hash":
        store = PrefixStore("pfx", store)
    built = Harness(store, store.clone, crosses_processes=False)
    yield built
    built.close()


class TestInProcessSessions(StoreSessionContract):
    """The session contract on HashStore, and on a PrefixStore over one."""


def test_a_prefix_session_keeps_its_keys_and_wills_under_the_prefix() -> None:
    inner = HashStore(TIMEOUT)
    with PrefixStore("run", inner).open_session(LONG) as session:
        session.set("present/a", "token")
        session.add_will("departures", "gone")
        assert inner.list_keys() == ["run/present/a"]
    assert inner.list_keys() == []
    assert inner.queue_pop("run/departures") == b"gone"


def test_a_session_owns_a_bounded_number_of_keys_and_wills() -> None:
    store, limits = HashStore(TIMEOUT), Limits()
    with store.open_session(LONG) as session:
        for index in range(limits.max_session_keys):
            session.set(f"k{index}", "v")
        session.set("k0", "rewritten: owned already")
        with pytest.raises(StoreLimitError, match="at most"):
            session.set("one/more", "v")
        with pytest.raises(StoreLimitError, match="at most"):
            session.compare_set("one/more", "", "v")
        assert not store.check(["one/more"])
        for _ in range(limits.max_session_wills):
            session.add_will("departures", "gone")
        with pytest.raises(StoreLimitError, match="wills"):
            session.add_will("departures", "one more")
    assert store.num_keys() == 0
    assert store.queue_len("departures") == limits.max_session_wills


def test_a_file_store_offers_no_sessions(tmp_path: Path) -> None:
    with (
        FileStore(str(tmp_path / "store"), timeout=TIMEOUT) as store,
        pytest.raises(UnsupportedOperationError, match="sessions"),
    ):
        store.open_session(LONG)
