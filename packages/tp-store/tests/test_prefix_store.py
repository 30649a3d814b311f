"""What ``PrefixStore`` adds to the contract: the key mapping and the delegation."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tp_store.stores.hash_store import HashStore
from tp_store.stores.prefix_store import PrefixStore


@pytest.fixture
def inner() -> HashStore:
    return HashStore()


@pytest.fixture
def prefixed(inner: HashStore) -> PrefixStore:
    return PrefixStore("job", inner)


def test_keys_are_stored_under_prefix_slash_key(prefixed: PrefixStore, inner: HashStore) -> None:
    prefixed.set("k", "v")
    prefixed.add(b"n", 2)
    prefixed.queue_push("q", "item")
    prefixed.multi_set(["m"], ["1"])
    assert inner.get("job/k") == b"v"
    assert inner.get("job/n") == b"2"
    assert inner.queue_len("job/q") == 1
    assert inner.get("job/m") == b"1"
    assert prefixed.prefix == "job"
    assert prefixed.underlying_store is inner


def test_list_keys_strips_the_prefix(prefixed: PrefixStore, inner: HashStore) -> None:
    inner.set("other", "x")
    inner.set("jobless", "x")
    prefixed.set("a", "1")
    prefixed.set("b/c", "2")
    assert sorted(prefixed.list_keys()) == ["a", "b/c"]
    assert prefixed.num_keys() == inner.num_keys() == 4


def test_prefixes_nest(inner: HashStore) -> None:
    PrefixStore("inner", PrefixStore("outer", inner)).set("k", "v")
    assert inner.get("outer/inner/k") == b"v"


def test_barrier_keys_are_prefixed(prefixed: PrefixStore, inner: HashStore) -> None:
    prefixed.barrier("gate", 1)
    assert inner.check(["job/gate"])


def test_timeout_is_the_underlying_stores(prefixed: PrefixStore, inner: HashStore) -> None:
    prefixed.set_timeout(3)
    assert inner.timeout == timedelta(seconds=3)
    inner.set_timeout(timedelta(seconds=4))
    assert prefixed.timeout == timedelta(seconds=4)


def test_clone_keeps_the_prefix_over_a_clone(prefixed: PrefixStore, inner: HashStore) -> None:
    twin = prefixed.clone()
    assert twin.prefix == "job"
    assert twin.underlying_store is not inner
    twin.set("k", "v")
    assert inner.get("job/k") == b"v"


def test_close_closes_the_underlying_store(inner: HashStore) -> None:
    closed = []

    class Spy(HashStore):
        def close(self) -> None:
            closed.append(self)

    spy = Spy()
    with PrefixStore("job", spy):
        pass
    assert closed == [spy]
