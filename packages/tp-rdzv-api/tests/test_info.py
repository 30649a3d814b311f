"""``RendezvousInfo`` and ``RendezvousStoreInfo`` (``build`` on real stores)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tp_rdzv_api import RendezvousInfo, RendezvousStateError, RendezvousStoreInfo
from tp_store import HashStore, PrefixStore, Store, StoreTimeoutError, TCPStore

# -- RendezvousStoreInfo -------------------------------------------------------------


def test_store_info_fields_and_aliases() -> None:
    info = RendezvousStoreInfo("node0", 29500)
    assert info.master_addr == info.addr == "node0"
    assert info.port == info.master_port == 29500
    assert info == RendezvousStoreInfo(master_addr="node0", port=29500)
    assert info != RendezvousStoreInfo("node0", 29501)
    assert hash(info) == hash(RendezvousStoreInfo("node0", 29500))
    assert repr(info) == "RendezvousStoreInfo(master_addr='node0', port=29500)"
    with pytest.raises(AttributeError):
        info.addr = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("addr", "port", "error", "message"),
    [
        ("", 1, ValueError, "master_addr must be a non-empty str"),
        (None, 1, ValueError, "master_addr must be a non-empty str"),
        ("h", 0, ValueError, "port must be in 1..65535, got 0"),
        ("h", 65536, ValueError, "port must be in 1..65535"),
        ("h", "80", TypeError, "port must be an int"),
        ("h", True, TypeError, "port must be an int"),
    ],
)
def test_store_info_validation(addr: Any, port: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        RendezvousStoreInfo(addr, port)


def build_all(
    world_size: int, store_for_rank: Callable[[int], Store], **kwargs: Any
) -> list[RendezvousStoreInfo]:
    """``build`` on every rank at once, one thread each; non-zero ranks start first."""
    with ThreadPoolExecutor(world_size) as pool:
        futures = {
            rank: pool.submit(RendezvousStoreInfo.build, rank, store_for_rank(rank), **kwargs)
            for rank in reversed(range(world_size))
        }
        return [futures[rank].result(timeout=30) for rank in range(world_size)]


@pytest.fixture
def tcp_master() -> Iterator[TCPStore]:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=30)
    yield store
    store.close()


def test_build_over_tcp_store_uses_its_listening_endpoint(tcp_master: TCPStore) -> None:
    clients = [TCPStore("127.0.0.1", tcp_master.port, timeout=30) for _ in range(3)]
    stores: list[Store] = [tcp_master, *clients]
    try:
        infos = build_all(4, stores.__getitem__, local_addr="ignored.example")
    finally:
        for client in clients:
            client.close()
    assert infos == [RendezvousStoreInfo("127.0.0.1", tcp_master.port)] * 4
    assert tcp_master.get(RendezvousStoreInfo.MASTER_ADDR_KEY) == b"127.0.0.1"
    assert tcp_master.get(RendezvousStoreInfo.MASTER_PORT_KEY) == str(tcp_master.port).encode()


def test_build_unwraps_prefix_stores(tcp_master: TCPStore) -> None:
    store = PrefixStore("outer", PrefixStore("inner", tcp_master))
    info = RendezvousStoreInfo.build(0, store)
    assert info == RendezvousStoreInfo("127.0.0.1", tcp_master.port)
    # Published through the prefixed store, so ranks sharing the prefix read it back.
    assert tcp_master.get("inner/outer/MASTER_PORT") == str(tcp_master.port).encode()
    assert RendezvousStoreInfo.build(1, store) == info


def test_build_over_a_wildcard_tcp_store_uses_local_addr() -> None:
    master = TCPStore("", 0, is_master=True, wait_for_workers=False, timeout=30)
    try:
        assert master.host == ""
        assert RendezvousStoreInfo.build(0, master, local_addr="node0.example") == (
            RendezvousStoreInfo("node0.example", master.port)
        )
        assert RendezvousStoreInfo.build(0, master) == (
            RendezvousStoreInfo(socket.getfqdn(), master.port)
        )
    finally:
        master.close()


def test_build_with_server_port(tcp_master: TCPStore) -> None:
    assert RendezvousStoreInfo.build(0, tcp_master, server_port=4242) == (
        RendezvousStoreInfo("127.0.0.1", 4242)
    )
    assert RendezvousStoreInfo.build(0, tcp_master, "node0", server_port=4243) == (
        RendezvousStoreInfo("node0", 4243)
    )
    assert RendezvousStoreInfo.build(3, tcp_master) == RendezvousStoreInfo("node0", 4243)
    assert RendezvousStoreInfo.build(0, HashStore(), server_port=4244) == (
        RendezvousStoreInfo(socket.getfqdn(), 4244)
    )


def test_build_over_a_hash_store_publishes_a_free_port() -> None:
    store = HashStore(timeout=30)
    infos = build_all(4, lambda _: store.clone(), local_addr="10.1.2.3")
    assert len(set(infos)) == 1
    info = infos[0]
    assert info.master_addr == "10.1.2.3"
    with socket.socket() as probe:  # the port was free a moment ago: it can be bound
        probe.bind(("", info.port))


def test_build_without_local_addr_uses_the_fqdn() -> None:
    store = HashStore()
    assert RendezvousStoreInfo.build(0, store).master_addr == socket.getfqdn()


def test_other_ranks_wait_for_rank_zero() -> None:
    store = HashStore(timeout=0.2)
    with pytest.raises(StoreTimeoutError):
        RendezvousStoreInfo.build(1, store)


def test_malformed_published_values() -> None:
    store = HashStore()
    store.set("MASTER_ADDR", "node0")
    store.set("MASTER_PORT", "http")
    with pytest.raises(RendezvousStateError, match="MASTER_PORT=b'http'"):
        RendezvousStoreInfo.build(1, store)
    store.set("MASTER_PORT", "0")
    with pytest.raises(RendezvousStateError, match="malformed"):
        RendezvousStoreInfo.build(1, store)
    store.set("MASTER_PORT", "80")
    store.set("MASTER_ADDR", b"\xff")
    with pytest.raises(RendezvousStateError, match="malformed"):
        RendezvousStoreInfo.build(1, store)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"rank": -1}, ValueError, "rank must be >= 0"),
        ({"rank": "0"}, TypeError, "rank must be an int"),
        ({"rank": 0, "server_port": 0}, ValueError, "server_port must be in 1..65535"),
        ({"rank": 0, "local_addr": 5}, TypeError, "local_addr must be a str or None"),
    ],
)
def test_build_validation(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        RendezvousStoreInfo.build(store=HashStore(), **kwargs)


# -- RendezvousInfo ----------------------------------------------------------------------


def test_info_defaults() -> None:
    store = HashStore()
    info = RendezvousInfo(store, 0, 1)
    assert info.store is store
    assert (info.rank, info.world_size) == (0, 1)
    assert info.bootstrap_store_info is None
    assert info.participants == []
    assert info.wait_list == []


def test_info_keeps_copies_of_the_lists() -> None:
    participants = ["a", "b"]
    wait_list = ["c"]
    bootstrap = RendezvousStoreInfo("a", 1234)
    info = RendezvousInfo(HashStore(), 1, 2, bootstrap, participants, wait_list)
    participants.append("x")
    wait_list.clear()
    assert info.participants == ["a", "b"]
    assert info.wait_list == ["c"]
    info.participants.append("y")
    assert info.participants == ["a", "b"]
    assert info.bootstrap_store_info is bootstrap
    assert "participants=['a', 'b']" in repr(info)


def test_info_is_read_only() -> None:
    info = RendezvousInfo(HashStore(), 0, 1)
    with pytest.raises(AttributeError):
        info.rank = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((None, 0, 1), TypeError, "needs a store"),
        ((HashStore(), -1, 1), ValueError, "rank must be >= 0"),
        ((HashStore(), 1.0, 2), TypeError, "rank must be an int"),
        ((HashStore(), 0, 0), ValueError, "world_size must be >= 1"),
        ((HashStore(), 0, "2"), TypeError, "world_size must be an int"),
        ((HashStore(), 2, 2), ValueError, r"rank must be < world_size \(2\), got 2"),
        ((HashStore(), 0, 1, ("h", 1)), TypeError, "bootstrap_store_info must be"),
    ],
)
def test_info_validation(args: tuple[Any, ...], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        RendezvousInfo(*args)
