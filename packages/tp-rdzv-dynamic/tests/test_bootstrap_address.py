"""Where rank 0's workers' bootstrap store is: one document, read in one request."""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tp_rdzv_api import RendezvousStateError, RendezvousStoreInfo
from tp_rdzv_dynamic.documents.board import STALE, VACATED, RendezvousBoard
from tp_rdzv_dynamic.documents.bootstrap_address import (
    decode_bootstrap_address,
    encode_bootstrap_address,
)
from tp_rdzv_dynamic.model.node_desc import MAX_ADDR_LENGTH
from tp_store import FileStore, HashStore, Store, TCPStore

WHERE = "key 'bootstrap/3'"
_ADDRESSES = st.text(
    st.characters(codec="utf-8", categories=("L", "N", "P", "S")), min_size=1, max_size=80
)


@settings(max_examples=200, deadline=None)
@given(addr=_ADDRESSES, port=st.integers(1, 65535))
def test_an_address_reads_back_as_it_was_published(addr: str, port: int):
    info = RendezvousStoreInfo(addr, port)
    raw = encode_bootstrap_address(info)
    assert decode_bootstrap_address(raw, WHERE) == info
    # Valid JSON in the documented format (other versions and backends read it).
    assert json.loads(raw) == {
        "format": "tp-rdzv-bootstrap",
        "schema": 1,
        "addr": addr,
        "port": port,
    }


def _document(**fields: object) -> bytes:
    base: dict[str, object] = {"format": "tp-rdzv-bootstrap", "schema": 1, "addr": "n", "port": 1}
    return json.dumps({**base, **fields}).encode()


@pytest.mark.parametrize(
    ("raw", "complaint"),
    [
        (b"node0:29500", "JSON"),
        (_document(port=0), "'port': expected 1 to 65535, got 0"),
        (_document(port=65536), "'port'"),
        (_document(port="29500"), "'port'"),
        (_document(addr=""), "'addr'"),
        (_document(addr="node0\nforged line"), "not printable"),
        (_document(addr="a" * (MAX_ADDR_LENGTH + 1)), "'addr'"),
        (_document(addr=["node0"]), "'addr'"),
        (_document(format="tp-rdzv-answer"), "format"),
    ],
)
def test_a_bad_address_is_a_state_error_naming_its_key(raw: bytes, complaint: str):
    with pytest.raises(RendezvousStateError, match=complaint) as caught:
        decode_bootstrap_address(raw, WHERE)
    assert WHERE in str(caught.value)


def test_a_node_reads_the_address_in_one_request_on_our_server(server: TCPStore):
    published = RendezvousStoreInfo("node0.example", 29500)
    rank0 = RendezvousBoard(server.clone(), "one")
    other = RendezvousBoard(server.clone(), "one")
    before = server.server_stats()["ops"]
    rank0.publish_bootstrap(3, published)
    found = other.await_bootstrap(3, 30)
    after = server.server_stats()["ops"]
    assert found == published
    spent = {op: after[op] - before.get(op, 0) for op in after if after[op] != before.get(op, 0)}
    # Published in one request (written once: the first address wins), read in one.
    assert spent == {"compare_set": 1, "wait_any": 1, "stats": 1}  # the first STATS counts itself


def test_the_first_address_published_for_a_round_is_every_nodes(server: TCPStore):
    steward, rank0 = RendezvousBoard(server.clone(), "one"), RendezvousBoard(server.clone(), "one")
    first = RendezvousStoreInfo("steward.example", 29500)
    assert steward.publish_bootstrap(3, first) == first
    # Rank 0 read an answer written before the steward published: its own store is unused.
    assert rank0.publish_bootstrap(3, RendezvousStoreInfo("rank0.example", 29400)) == first
    assert rank0.await_bootstrap(3, 30) == first


@pytest.fixture(params=["tcp", "hash", "file"])
def any_store(request: pytest.FixtureRequest, server: TCPStore, tmp_path) -> Store:
    """Our server, and stores without WAIT_GET (a wait then a get)."""
    if request.param == "tcp":
        return server.clone()
    if request.param == "hash":
        return HashStore()
    return FileStore(str(tmp_path / "store"), 2)


def test_a_node_waits_for_rank_0_on_any_store(any_store: Store):
    published = RendezvousStoreInfo("node0.example", 29500)
    rank0, other = RendezvousBoard(any_store, "any"), RendezvousBoard(any_store.clone(), "any")
    assert other.await_bootstrap(5, 0.05) is None  # not yet published: None, not an error
    assert not other.has_bootstrap(5)
    publisher = threading.Timer(0.2, rank0.publish_bootstrap, (5, published))
    publisher.start()
    try:
        assert other.await_bootstrap(5, 60) == published
    finally:
        publisher.join()
    assert other.has_bootstrap(5)


@pytest.fixture(params=["tcp", "hash"])
def waiting_store(request: pytest.FixtureRequest, server: TCPStore) -> Store:
    """The stores that wait for the first of several keys (``wait_any``)."""
    return server.clone() if request.param == "tcp" else HashStore()


def test_a_wait_for_the_address_ends_when_the_round_goes_stale(waiting_store: Store):
    steward = RendezvousBoard(waiting_store, "any")
    other = RendezvousBoard(waiting_store.clone(), "any")
    marker = threading.Timer(0.2, steward.mark_stale, (5,))
    marker.start()
    try:
        assert other.await_bootstrap(5, 60) is STALE
    finally:
        marker.join()
    # Published before the round went stale, the address wins: the round ran.
    steward.publish_bootstrap(6, RendezvousStoreInfo("node0.example", 29500))
    steward.mark_stale(6)
    assert other.await_bootstrap(6, 60) == RendezvousStoreInfo("node0.example", 29500)


def test_a_wait_for_the_address_ends_when_the_stewards_session_ends(waiting_store: Store):
    steward = RendezvousBoard(waiting_store, "any")
    other = RendezvousBoard(waiting_store.clone(), "any")
    session = waiting_store.open_session(60)
    steward.leave_vacancy_will(session, 4)
    steward.mark_stale_when_ended(session, 5)
    # Waiting for the vacancy of epoch 4: the stale mark and the vacancy come
    # together with the session's end; either ends the wait at once.
    ender = threading.Timer(0.2, session.close)
    ender.start()
    try:
        assert other.await_bootstrap(5, 60, vacancy=4) in {STALE, VACATED}
    finally:
        ender.join()
    # Only the vacancy: the wait for the address of another round ends with it.
    assert other.await_bootstrap(7, 60, vacancy=4) is VACATED


def test_a_store_without_wait_any_waits_for_the_address_alone(tmp_path):
    store = FileStore(str(tmp_path / "store"), 2)
    steward, other = RendezvousBoard(store, "any"), RendezvousBoard(store.clone(), "any")
    steward.mark_stale(5)
    assert other.await_bootstrap(5, 0.05) is None  # the store said it cannot: None at once
    assert not other.waits_for_either
    assert other.await_bootstrap(5, 0.05) is None  # the address alone: the stale mark unseen
    steward.publish_bootstrap(5, RendezvousStoreInfo("node0.example", 29500))
    assert other.await_bootstrap(5, 60) == RendezvousStoreInfo("node0.example", 29500)
