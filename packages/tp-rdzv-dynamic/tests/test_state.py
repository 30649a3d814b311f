"""The state and round outcome documents: versioned JSON, strictly decoded."""

from __future__ import annotations

import json
import pickle
import re
import zlib

import pytest

from tp_rdzv_api import RendezvousStateError
from tp_rdzv_dynamic.documents.bounded_json import MAX_DOCUMENT_BYTES
from tp_rdzv_dynamic.documents.codecs import (
    decode_outcome,
    decode_state,
    encode_outcome,
    encode_state,
)
from tp_rdzv_dynamic.model.node_desc import _NodeDesc
from tp_rdzv_dynamic.model.state import RendezvousState, RoundOutcome

A = _NodeDesc("node-a", 10, 0)
B = _NodeDesc("node-b", 11, 1)
C = _NodeDesc("10.0.0.7", 12, 2)
WHERE = "key 'tp_rdzv/run/state'"


def sample() -> RendezvousState:
    return RendezvousState(
        round=3,
        complete=True,
        closed=False,
        participants={B: 0, A: 1},
        wait_list={C: None},
        redundancy_list={},
        hints={A: 1},
        last_order=[B, A],
        epoch=7,
    )


def test_state_round_trips():
    state = sample()
    assert decode_state(encode_state(state), WHERE) == state


def test_a_completed_round_that_lost_a_participant_round_trips():
    # Survivors keep their ranks, so the ranks have a gap: a new steward must
    # still load the state (it used to be refused, stranding every node).
    state = sample()
    state.participants = {A: 1}
    assert decode_state(encode_state(state), WHERE) == state


def test_state_is_versioned_json_not_pickle():
    document = json.loads(encode_state(sample()))
    assert document["format"] == "tp-rdzv-state"
    assert document["schema"] == 1


def mutate(**changes: object) -> bytes:
    document = json.loads(encode_state(sample()))
    document.update(changes)
    return json.dumps(document).encode()


@pytest.mark.parametrize(
    ("raw", "complaint"),
    [
        (b"\x80\x04\x95", "is not JSON"),
        (pickle.dumps({"round": 1}), "is not JSON"),
        (b"[1, 2]", "is not a JSON object"),
        (mutate(format="something-else"), "has format"),
        (mutate(schema=2), "schema version 2"),
        (mutate(round=-1), "'round'"),
        (mutate(round="3"), "'round'"),
        (mutate(complete="yes"), "'complete'"),
        (mutate(epoch=True), "'epoch'"),
        (mutate(participants=[["node-a", 10, 0]]), "participants[0]"),
        (mutate(participants=[["", 10, 0, 0]]), "participants[0]"),
        (mutate(wait_list=[["node-c", -1, 0]]), "wait_list[0]"),
        (mutate(wait_list={"a": 1}), "'wait_list'"),
        (mutate(participants=[["node-a", 10, 0, 0], ["node-b", 11, 1, 5]]), "ranks are not"),
        (mutate(participants=[["node-b", 11, 1, 1], ["node-a", 10, 0, 1]]), "ranks are not"),
    ],
)
def test_corrupt_state_names_the_key(raw, complaint):
    with pytest.raises(RendezvousStateError) as caught:
        decode_state(raw, WHERE)
    assert WHERE in str(caught.value)
    assert complaint in str(caught.value)


def test_a_complete_outcome_names_the_world_size_not_the_participants():
    # Every node waits for it: its size must not grow with the job.
    many = sample()
    many.participants = {_NodeDesc(f"node-{i}", i, 0): i for i in range(5000)}
    raw = encode_outcome(many.outcome())
    assert len(raw) < 200
    outcome = decode_outcome(raw, "key 'result/3'")
    assert (outcome.round, outcome.closed, outcome.world_size) == (3, False, 5000)
    assert outcome.participants == ()
    assert encode_outcome(outcome) == raw


def test_closed_outcome():
    raw = encode_outcome(RoundOutcome(4, closed=True))
    # The wire format other versions read: a closed round names no one.
    expected = {"format": "tp-rdzv-round", "schema": 1, "round": 4, "status": "closed"}
    assert json.loads(raw) == expected
    outcome = decode_outcome(raw, "key 'result/4'")
    assert outcome.closed
    assert outcome.round == 4
    assert outcome.participants == ()


def test_failed_outcome_names_the_error():
    raw = encode_outcome(RoundOutcome(5, closed=False, error="the state is corrupt"))
    outcome = decode_outcome(raw, "key 'result/5'")
    assert (outcome.round, outcome.closed, outcome.error) == (5, False, "the state is corrupt")


@pytest.mark.parametrize(
    ("document", "complaint"),
    [
        ({"format": "tp-rdzv-round", "schema": 1, "round": 1, "status": "odd"}, "status"),
        (
            {"format": "tp-rdzv-round", "schema": 1, "round": 1, "status": "complete"},
            "world_size",
        ),
        (
            {
                "format": "tp-rdzv-round",
                "schema": 1,
                "round": 1,
                "status": "complete",
                "world_size": 0,
            },
            "without participants",
        ),
        ({"format": "tp-rdzv-state", "schema": 1}, "has format"),
    ],
)
def test_corrupt_outcome_names_the_key(document, complaint):
    with pytest.raises(RendezvousStateError, match=complaint) as caught:
        decode_outcome(json.dumps(document).encode(), "key 'result/1'")
    assert "key 'result/1'" in str(caught.value)


def test_node_text_is_the_same_everywhere():
    assert str(A) == repr(A) == "node-a_10_0"
    assert A.key == "node-a_10_0"


def test_a_compression_bomb_is_refused_after_inflating_no_more_than_the_bound():
    # ~254 KB that would inflate to 256 MiB: refused once past the store's
    # largest value (a document no steward writes), not at 256 MiB.
    deflater = zlib.compressobj(9)
    spaces = b" " * (1 << 20)
    bomb = b"".join([deflater.compress(b"{"), *(deflater.compress(spaces) for _ in range(256))])
    bomb += deflater.flush()
    assert len(bomb) < 300_000
    with pytest.raises(RendezvousStateError, match=f"inflates to more than {MAX_DOCUMENT_BYTES} "):
        decode_outcome(bomb, "key 'result/9'")
    assert MAX_DOCUMENT_BYTES == 8 << 20


def test_a_truncated_compressed_outcome_is_refused():
    state = RendezvousState(complete=True, participants={A: 0}, last_order=[A])
    raw = encode_outcome(state.outcome())
    packed = zlib.compress(raw + b" " * 5000)
    with pytest.raises(RendezvousStateError, match="truncated"):
        decode_outcome(packed[: len(packed) // 2], "key 'result/9'")


@pytest.mark.parametrize(
    ("raw", "complaint"),
    [
        (b"[" * 100_000, "brackets do not pair"),
        (b"[" * 5000 + b"]" * 5000, "nests deeper than 3 levels"),
        (b'{"format":"tp-rdzv-state","participants":[[["a",1,0,0]]]}', "nests deeper"),
        (b"{" + b" " * (9 << 20) + b"}", f"more than the {MAX_DOCUMENT_BYTES} allowed"),
        (mutate(wait_list=[["n" * 1025, 1, 0]]), "wait_list[0]"),
        (mutate(redundancy_list=[["node-a", 10, 0]]), "more than one of participants"),
    ],
)
def test_state_documents_are_bounded(raw, complaint):
    with pytest.raises(RendezvousStateError, match=re.escape(complaint)):
        decode_state(raw, WHERE)


def test_many_escaped_quotes_are_read_in_linear_time():
    # One unterminated string of 300,000 \" (more escapes are refused before
    # any scan, as too many values): a pattern that matched strings with their
    # escapes took quadratic time (hours) on it.
    raw = b'{"a":"' + b'\\"' * 300_000
    with pytest.raises(RendezvousStateError, match="is not JSON"):
        decode_state(raw, WHERE)


def test_brackets_in_names_do_not_count_as_nesting():
    state = sample()
    odd = _NodeDesc('[[[[{"x\\"]]]]', 1, 0)
    state.wait_list = {odd: None}
    assert decode_state(encode_state(state), WHERE).wait_list == {odd: None}


def test_corrupt_compressed_outcome():
    with pytest.raises(RendezvousStateError, match="not valid zlib"):
        decode_outcome(b"x\x9c garbage", "key 'result/9'")
