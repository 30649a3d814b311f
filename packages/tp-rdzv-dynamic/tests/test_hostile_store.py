"""Hostile bytes in a real store: the rendezvous refuses them clearly or goes on without them.

Anyone who can write to the store can leave anything in the keys a rendezvous
reads. Each test writes such bytes to a real TCPStore server on loopback, then
runs real handlers (nodes as threads) against it.
"""

from __future__ import annotations

import logging
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest
from handler_threads import RUN, rendezvous_all

from tp_rdzv_api import (
    RendezvousClosedError,
    RendezvousInfo,
    RendezvousStateError,
)
from tp_rdzv_dynamic import DynamicRendezvousHandler, _NodeDesc
from tp_rdzv_dynamic.documents.bounded_json import MAX_DOCUMENT_BYTES
from tp_rdzv_dynamic.documents.codecs import (
    OUTCOME_FORMAT,
    SCHEMA,
    Lease,
    encode_message,
    encode_state,
)
from tp_rdzv_dynamic.model.decisions import Join, Leave
from tp_rdzv_dynamic.model.state import RendezvousState
from tp_store import TCPStore

KEYS = f"tp_rdzv/{RUN}/"
#: Deeply nested JSON: Python's parser raises RecursionError on it.
DEEP = b"[" * 100_000 + b"]" * 100_000
#: A join for a node that never beats (its heartbeat key never appears).
GHOST = _NodeDesc("ghost", 1, 0)


def steward_epoch(server: TCPStore) -> int:
    return Lease.parse(server.get(KEYS + "steward")).epoch


def padded_outcome(padding: int) -> bytes:
    """A closed-round outcome for round 0 padded with whitespace, zlib-compressed in steps."""
    head = f'{{"format":"{OUTCOME_FORMAT}","schema":{SCHEMA},"round":0,"status":"closed"'
    deflater = zlib.compressobj()
    pieces = [deflater.compress(head.encode())]
    chunk = b" " * (1 << 20)
    pieces += [deflater.compress(chunk) for _ in range(padding >> 20)]
    pieces += [deflater.compress(b"}"), deflater.flush()]
    return b"".join(pieces)


@pytest.mark.parametrize(
    "message",
    [
        b"[" * 100_000,
        DEEP,
        b'{"op":"join","node":' + b"[" * 50_000,
        b"{" + b" " * (1 << 20) + b"}",  # larger than any message
        # A name too long for a store key: the steward's heartbeat read would
        # make the server close its connection.
        encode_message(Join(_NodeDesc("n" * 10_000, 1, 0), None, 0)),
        b'{"op":"join","node":["n\xc2\xb2",1,0],"round":' + b"9" * 5000 + b"}",
        encode_message(Leave(GHOST), "rcpt/" + "r" * 10_000),  # too long for a key
    ],
    ids=["unclosed", "deep", "deep-node", "huge", "long-name", "long-number", "long-receipt"],
)
def test_the_steward_drops_a_hostile_message_and_the_round_completes(
    make_node, server, caplog, message
):
    server.queue_push(KEYS + "mailbox", message)
    caplog.set_level(logging.WARNING, logger="tp_rdzv_dynamic")
    infos = rendezvous_all([make_node(2, 2), make_node(2, 2)])
    assert sorted(info.rank for info in infos) == [0, 1]
    # One steward decided it all: the message did not kill it (a new one would
    # have taken office at a higher epoch).
    assert steward_epoch(server) == 1
    assert "dropped a malformed mailbox message" in caplog.text


@pytest.mark.parametrize("key", ["closed", "steward", "state"])
def test_a_receipt_cannot_make_the_steward_write_another_key(make_node, server, key):
    # The steward confirms a receipt by setting the key it names.
    server.queue_push(KEYS + "mailbox", encode_message(Leave(GHOST), key))
    infos = rendezvous_all([make_node(2, 2), make_node(2, 2)])
    assert sorted(info.rank for info in infos) == [0, 1]
    assert not server.check([KEYS + key]) or server.get(KEYS + key) != b"1"
    assert not make_node(1, 1).is_closed()


def test_a_deeply_nested_state_is_a_state_error(make_node, server):
    server.set(KEYS + "state", DEEP)
    handler = make_node(1, 1, join=20)
    with pytest.raises(RendezvousStateError, match="nests deeper than 3 levels"):
        handler.set_closed()
    # The steward reports it to the waiting node instead of dying at every tick.
    with pytest.raises(RendezvousStateError, match=f"{KEYS}state"):
        handler.next_rendezvous()


def test_a_state_listing_a_node_twice_is_reported_not_fatal_to_the_steward(make_node, server):
    # The steward samples each member's heartbeat once: a node in two lists
    # used to kill it at every scan.
    twice = RendezvousState(participants={GHOST: 0}, wait_list={GHOST: None})
    server.set(KEYS + "state", encode_state(twice))
    with pytest.raises(RendezvousStateError, match="more than one of participants"):
        make_node(1, 1, join=20).next_rendezvous()


def test_a_deeply_nested_round_outcome_is_a_state_error(make_node, server):
    server.set(KEYS + "result/0", DEEP)
    with pytest.raises(RendezvousStateError, match=f"{KEYS}result/0.*nests deeper"):
        make_node(1, 1).next_rendezvous()


def test_a_compressed_outcome_inflating_past_the_bound_is_refused(make_node, server):
    # 100 MiB of whitespace in ~100 KB: a valid document, but no steward writes
    # one that large, and every node of a job would inflate it.
    bomb = padded_outcome(100 << 20)
    assert len(bomb) < 200_000
    server.set(KEYS + "result/0", bomb)
    with pytest.raises(RendezvousStateError, match=f"inflates to more than {MAX_DOCUMENT_BYTES}"):
        make_node(1, 1).next_rendezvous()


def test_a_compressed_outcome_within_the_bound_is_read(make_node, server):
    server.set(KEYS + "result/0", padded_outcome(4 << 20))
    with pytest.raises(RendezvousClosedError):
        make_node(1, 1).next_rendezvous()


@pytest.mark.parametrize(
    ("report", "complaint"),
    [
        (DEEP, "nests deeper"),
        (b'{"format":"tp-rdzv-liveness","ages":{"a":1' + b"0" * 400 + b"}}", "bad age"),
    ],
)
def test_a_hostile_liveness_report_is_a_state_error(make_node, server, report, complaint):
    handler = make_node(1, 1)
    server.set(KEYS + "liveness", report)
    with pytest.raises(RendezvousStateError, match=complaint):
        handler.status()


def test_a_huge_lease_counts_as_vacant_and_the_round_completes(make_node, server):
    server.set(KEYS + "steward", b"7" * (4 << 20) + b" x 1 0")
    infos = rendezvous_all([make_node(2, 2), make_node(2, 2)])
    assert sorted(info.rank for info in infos) == [0, 1]


def test_nodes_whose_names_hold_non_ascii_digits_rendezvous(make_node, server):
    # "²".isdigit() is true but int("²") fails: the natural order of names
    # must not take it for a number.
    # Rank 0 (first in that order) hosts the workers' bootstrap store on its address:
    # one this host can listen on.
    names = ["127.0.0.1", "node1\N{SUPERSCRIPT TWO}", "node2", "node\N{ARABIC-INDIC DIGIT THREE}"]
    handlers = [make_node(4, 4, local_addr=name, join=20) for name in names]
    infos = rendezvous_all(handlers)
    assert sorted(info.rank for info in infos) == [0, 1, 2, 3]
    assert [node.addr for node in infos[0].participants] == [
        "127.0.0.1",
        "node1\N{SUPERSCRIPT TWO}",
        "node2",
        "node\N{ARABIC-INDIC DIGIT THREE}",
    ]


def test_a_forged_join_does_not_stall_the_rendezvous(make_node, server):
    # The ghost never beats: its heartbeat key never appears. Reading it must
    # not block the steward; the ghost is dead after the liveness bound (1 s).
    server.queue_push(KEYS + "mailbox", encode_message(Join(GHOST, None, 0)))
    handlers = [make_node(2, 3, join=20) for _ in range(2)]

    def settle(handler: DynamicRendezvousHandler) -> RendezvousInfo:
        while True:
            info = handler.next_rendezvous()
            if GHOST not in info.participants:
                return info
            assert handler.wait_for_change(30), "the ghost was never found dead"

    with ThreadPoolExecutor(2) as pool:
        infos = list(pool.map(settle, handlers))
    assert sorted(info.rank for info in infos) == [0, 1]
    assert {info.world_size for info in infos} == {2}
