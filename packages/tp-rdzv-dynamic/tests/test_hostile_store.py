"""Hostile bytes in a real store: the rendezvous refuses them clearly or goes on without them.

Anyone who can write to the store can leave anything in the keys a rendezvous
reads. Each test writes such bytes to a real TCPStore server on loopback, then
runs real handlers (nodes as threads) against it.
"""

from __future__ import annotations

import base64
import json
import logging
import pickle
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

import hostile_data
import pytest
from handler_threads import (
    RUN,
    make_handler,
    recorded_thread_deaths,
    rendezvous_all,
    running_server,
    stop_handler,
)
from hypothesis import given, settings
from hypothesis import strategies as st

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
    decode_message,
    encode_message,
    encode_state,
)
from tp_rdzv_dynamic.model.decisions import Join, Leave
from tp_rdzv_dynamic.model.state import RendezvousState
from tp_rdzv_dynamic.testing import hash_bomb, shared_tuple_tree, torch_state_around
from tp_rdzv_dynamic.torch_compat.torch_c10d import TorchC10dRun
from tp_store import TCPStore
from tp_store.testing.bounds import within_bounds

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
        # A lone surrogate cannot be encoded into a key: the steward died on it.
        b'{"op":"join","node":["evil\\ud800",1,0],"round":0}',
        b'{"op":"leave","node":["a\\nforged line",1,0]}',
        b'{"op":"gone","node":["ghost",1,0],"token":"\\udc80"}',
        b'{"op":"leave","node":["ghost",1,0],"receipt":"rcpt/\\ud800"}',
        b'{"op":"join","node":["ghost",18446744073709551616,0],"round":0}',
    ],
    ids=[
        "unclosed",
        "deep",
        "deep-node",
        "huge",
        "long-name",
        "long-number",
        "long-receipt",
        "surrogate-name",
        "control-name",
        "surrogate-token",
        "surrogate-receipt",
        "pid-2**64",
    ],
)
def test_the_steward_drops_a_hostile_message_and_the_round_completes(
    make_node, server, caplog, thread_deaths, message
):
    server.queue_push(KEYS + "mailbox", message)
    caplog.set_level(logging.WARNING, logger="tp_rdzv_dynamic")
    infos = rendezvous_all([make_node(2, 2), make_node(2, 2)])
    assert sorted(info.rank for info in infos) == [0, 1]
    # One steward decided it all: the message did not kill it (a new one would
    # have taken office at a higher epoch).
    assert steward_epoch(server) == 1
    assert "dropped a malformed mailbox message" in caplog.text
    assert thread_deaths == []
    # One line, whatever the message held.
    assert all(len(record.getMessage()) < 1000 for record in caplog.records)


@pytest.mark.parametrize("key", ["closed", "steward", "state"])
def test_a_receipt_cannot_make_the_steward_write_another_key(make_node, server, key):
    # The steward confirms a receipt by setting the key it names.
    server.queue_push(KEYS + "mailbox", encode_message(Leave(GHOST), key))
    infos = rendezvous_all([make_node(2, 2), make_node(2, 2)])
    assert sorted(info.rank for info in infos) == [0, 1]
    assert not server.check([KEYS + key]) or server.get(KEYS + key) != b"1"
    assert not make_node(1, 1).is_closed()


def put(server: TCPStore, key: str, value: str | bytes) -> None:
    """Store ``value`` at ``key`` before any node reads it: SET has no answer, so a
    read on another connection (a node's) could overtake a large write; a read on
    this one is served after it."""
    server.set(key, value)
    assert server.check([key])


def test_a_deeply_nested_state_is_a_state_error(make_node, server):
    put(server, KEYS + "state", DEEP)
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
    put(server, KEYS + "state", encode_state(twice))
    with pytest.raises(RendezvousStateError, match="more than one of participants"):
        make_node(1, 1, join=20).next_rendezvous()


def test_a_deeply_nested_round_outcome_is_a_state_error(make_node, server):
    put(server, KEYS + "result/0", DEEP)
    with pytest.raises(RendezvousStateError, match=f"{KEYS}result/0.*nests deeper"):
        make_node(1, 1).next_rendezvous()


def test_a_compressed_outcome_inflating_past_the_bound_is_refused(make_node, server):
    # 100 MiB of whitespace in ~100 KB: a valid document, but no steward writes
    # one that large, and every node of a job would inflate it.
    bomb = padded_outcome(100 << 20)
    assert len(bomb) < 200_000
    put(server, KEYS + "result/0", bomb)
    with pytest.raises(RendezvousStateError, match=f"inflates to more than {MAX_DOCUMENT_BYTES}"):
        make_node(1, 1).next_rendezvous()


def test_a_compressed_outcome_within_the_bound_is_read(make_node, server):
    put(server, KEYS + "result/0", padded_outcome(4 << 20))
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
    put(server, KEYS + "liveness", report)
    with pytest.raises(RendezvousStateError, match=complaint):
        handler.status()


def test_a_huge_lease_counts_as_vacant_and_the_round_completes(make_node, server):
    put(server, KEYS + "steward", b"7" * (4 << 20) + b" x 1 0")
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


def test_a_local_addr_that_cannot_be_a_key_is_a_value_error(make_node):
    with pytest.raises(ValueError, match="local_addr 'host\\\\udc80' holds characters"):
        make_node(1, 1, local_addr="host\udc80")


def test_a_huge_value_in_the_state_makes_a_short_error(make_node, server, thread_deaths):
    # The value was quoted whole: an 8 MB message, logged by the steward.
    document = json.loads(encode_state(RendezvousState()))
    document["round"] = "x" * (MAX_DOCUMENT_BYTES - 1000)
    put(server, KEYS + "state", json.dumps(document))
    handler = make_node(1, 1, join=20)
    with pytest.raises(RendezvousStateError) as caught:
        handler.status()
    assert len(str(caught.value)) < 1000
    with pytest.raises(RendezvousStateError) as caught:
        handler.next_rendezvous()
    assert len(str(caught.value)) < 1000
    assert thread_deaths == []


@pytest.mark.parametrize(
    "lease",
    [
        b"1 evil\xed\xa0\x80 * 0",  # not UTF-8
        b"9" * 5000 + b" x 1 0",  # too long for int()
        b"-7 node 1 -3",
        b"1 - 1 0 extra",
        b"\x00\x00\x00\x00",
        b"1 forged\nline * 0",  # a holder no node key can be (status prints it)
    ],
)
def test_a_hostile_lease_is_vacant_and_the_round_completes(make_node, server, thread_deaths, lease):
    put(server, KEYS + "steward", lease)
    infos = rendezvous_all([make_node(2, 2), make_node(2, 2)])
    assert sorted(info.rank for info in infos) == [0, 1]
    assert thread_deaths == []


def refused(message: bytes) -> bool:
    """Whether the steward drops ``message`` (a valid one is a forged message, another test's)."""
    try:
        decode_message(message)
    except ValueError:
        return True
    return False


@settings(max_examples=max(hostile_data.EXAMPLES // 20, 3), deadline=None)
@given(st.lists(hostile_data.DOCUMENT_MESSAGES.filter(refused), min_size=1, max_size=20))
def test_the_steward_outlives_any_batch_of_hostile_messages(messages):
    deaths: list[threading.ExceptHookArgs] = []
    with recorded_thread_deaths(deaths), running_server() as store:
        for message in messages:
            store.queue_push(KEYS + "mailbox", message)
        handlers = [make_handler(store.port, 2, 2) for _ in range(2)]
        try:
            infos = rendezvous_all(handlers)
        finally:
            for handler in handlers:
                stop_handler(handler)
        assert sorted(info.rank for info in infos) == [0, 1]
        assert steward_epoch(store) == 1
    assert deaths == []


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        # A node whose address is a 64-level tree of shared tuples (1.5 KB): hashing
        # it while unpickling took 2**64 steps, in C code Ctrl-C could not stop.
        (hash_bomb(), "memo reference"),
        # The same tree as a member of the wait list's set.
        (
            base64.b64encode(
                pickle.PROTO
                + b"\x04"
                + pickle.EMPTY_SET
                + pickle.MARK
                + shared_tuple_tree(64)
                + pickle.ADDITEMS
                + pickle.STOP
            ),
            "memo reference",
        ),
        # 8 MB of base64 of EMPTY_SET opcodes: 5.7 s and 1.48 GB before an error.
        (base64.b64encode(pickle.PROTO + b"\x04" + pickle.EMPTY_SET * 6_000_000), "more than"),
        # Within the size bound, but more sets than a state of 10,000 nodes holds.
        (base64.b64encode(pickle.PROTO + b"\x04" + pickle.EMPTY_SET * 700_000), "containers"),
        # A node's address that cannot be a key.
        (
            torch_state_around(pickle.SHORT_BINUNICODE + b"\x03\xed\xa0\x80"),
            "printable",
        ),
    ],
    ids=["hash-bomb-address", "hash-bomb-member", "8mb-of-sets", "many-sets", "surrogate"],
)
def test_a_hostile_pytorch_state_is_a_short_state_error(server, value, complaint):
    server.set(f"torch.rendezvous.{RUN}", value)
    error = within_bounds(lambda: TorchC10dRun(server, RUN).read(), (RendezvousStateError,))
    assert isinstance(error, RendezvousStateError)
    assert complaint in str(error)
