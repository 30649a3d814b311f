"""A completed round's per-node answers and roster: the codecs, and the board on a real server."""

from __future__ import annotations

import json
import threading
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tp_rdzv_api import RendezvousStateError, RendezvousStoreInfo
from tp_rdzv_dynamic.documents.answers import (
    Seat,
    answers,
    decode_answer,
    decode_roster,
    encode_answer,
    encode_roster,
)
from tp_rdzv_dynamic.documents.board import ANSWER_BATCH, VACATED, RendezvousBoard
from tp_rdzv_dynamic.documents.codecs import decode_outcome
from tp_rdzv_dynamic.model.node_desc import _NodeDesc
from tp_rdzv_dynamic.model.state import RendezvousState, RoundOutcome
from tp_store import FileStore, TCPStore

WHERE = "key 'answer/3/a'"
_ANSWER = b'{"format":"tp-rdzv-answer","schema":1,"round":1,"rank":0,"world_size":1,%s}'


def completed(size: int, round_: int = 3, waiting: int = 0) -> RoundOutcome:
    """``round_`` completed with ``size`` nodes, ``waiting`` more on the wait list."""
    nodes = [_NodeDesc(f"worker-{i:05d}.cluster.example.com", 4242, 0) for i in range(size)]
    state = RendezvousState(
        round=round_,
        complete=True,
        participants={node: rank for rank, node in enumerate(nodes)},
        wait_list={_NodeDesc(f"late-{i}", 1, 0): None for i in range(waiting)},
        last_order=nodes,
    )
    return state.outcome()


@settings(max_examples=200, deadline=None)
@given(
    round_=st.integers(0, 2**40),
    world_size=st.integers(1, 2**31),
    data=st.data(),
)
def test_an_answer_reads_back_as_the_seat_it_was_encoded_from(round_, world_size, data):
    seat = Seat(round_, data.draw(st.integers(0, world_size - 1)), world_size)
    raw = encode_answer(seat)
    assert decode_answer(raw, WHERE) == seat
    # Valid JSON in the documented format (other backends and versions read it).
    assert json.loads(raw) == {
        "format": "tp-rdzv-answer",
        "schema": 1,
        "round": round_,
        "rank": seat.rank,
        "world_size": world_size,
    }


@settings(max_examples=50, deadline=None)
@given(size=st.integers(1, 300))
def test_each_participant_is_answered_its_rank_and_the_world_size(size):
    outcome = completed(size)
    seats = {node: decode_answer(raw, WHERE) for node, raw in answers(outcome)}
    assert list(seats) == list(outcome.participants)
    assert [seat.rank for seat in seats.values()] == list(range(size))
    assert {(seat.round, seat.world_size) for seat in seats.values()} == {(3, size)}


def test_an_answer_names_the_bootstrap_store_its_steward_hosts():
    hosted = RendezvousStoreInfo("steward-7.cluster.example.com", 29500)
    raw = dict(answers(completed(4), hosted))[completed(4).participants[2]]
    assert decode_answer(raw, WHERE) == Seat(3, 2, 4, hosted)
    assert json.loads(raw)["bootstrap"] == {"addr": hosted.master_addr, "port": 29500}
    # The same document as encode_answer's, which the steward does not format per node.
    assert raw == encode_answer(Seat(3, 2, 4, hosted))


def test_an_answer_does_not_grow_with_the_job():
    assert len(max((raw for _, raw in answers(completed(16_000))), key=len)) < 100
    hosted = RendezvousStoreInfo("steward-7.cluster.example.com", 29500)
    assert len(max((raw for _, raw in answers(completed(16_000), hosted)), key=len)) < 160


@pytest.mark.parametrize(
    ("raw", "complaint"),
    [
        (b'{"format":"tp-rdzv-answer","schema":1,"round":1,"rank":4,"world_size":4}', "rank 4"),
        (b'{"format":"tp-rdzv-answer","schema":1,"round":1,"rank":-1,"world_size":4}', "'rank'"),
        (b'{"format":"tp-rdzv-answer","schema":1,"round":1,"rank":0}', "'world_size'"),
        (b'{"format":"tp-rdzv-round","schema":1,"round":1}', "has format"),
        (b'{"format":"tp-rdzv-answer","schema":2,"round":1,"rank":0,"world_size":1}', "schema"),
        (b"[[[[[[]]]]]]", "nests deeper"),
        (_ANSWER % b'"bootstrap":"node0:29500"', "'bootstrap': expected an object"),
        (_ANSWER % b'"bootstrap":{"addr":"node0"}', "'port'"),
        (_ANSWER % b'"bootstrap":{"addr":"node0","port":0}', "'port': expected 1 to 65535"),
        (_ANSWER % b'"bootstrap":{"addr":"n\\nforged line","port":1}', "not printable"),
        (_ANSWER % b'"bootstrap":{"addr":"","port":1}', "'addr'"),
    ],
)
def test_a_bad_answer_is_a_state_error_naming_its_key(raw, complaint):
    with pytest.raises(RendezvousStateError, match=complaint) as caught:
        decode_answer(raw, WHERE)
    assert WHERE in str(caught.value)


def test_a_roster_reads_back_with_every_list_in_order():
    outcome = completed(5, waiting=2)
    roster = decode_roster(encode_roster(outcome), "key 'roster/3'")
    assert roster.round == 3
    assert roster.participants == outcome.participants
    assert roster.wait_list == outcome.wait_list
    assert roster.redundancy_list == ()


def test_a_large_roster_travels_compressed():
    outcome = completed(2000)
    raw = encode_roster(outcome)
    plain = json.dumps(json.loads(zlib.decompress(raw))).encode()
    assert len(raw) < len(plain) / 5
    assert decode_roster(raw, "key 'roster/3'").participants == outcome.participants


def test_a_roster_listing_a_participant_twice_is_refused():
    node = ["a", 1, 0]
    document = {
        "format": "tp-rdzv-roster",
        "schema": 1,
        "round": 1,
        "participants": [node, node],
        "wait_list": [],
        "redundancy_list": [],
    }
    with pytest.raises(RendezvousStateError, match="twice"):
        decode_roster(json.dumps(document).encode(), "key 'roster/1'")


def test_the_board_answers_every_participant_in_a_few_requests(server: TCPStore):
    size = 2 * ANSWER_BATCH + 5
    outcome = completed(size, waiting=1)
    board = RendezvousBoard(server.clone(), "big")
    before = server.server_stats()["ops"]
    published = board.publish(outcome)
    after = server.server_stats()["ops"]
    assert decode_outcome(published, "result/3").world_size == size
    # The answers in three requests, not one per node.
    assert after.get("multi_set", 0) - before.get("multi_set", 0) == 3
    reader = RendezvousBoard(server.clone(), "big")
    for rank in (0, ANSWER_BATCH, size - 1):
        node = outcome.participants[rank]
        assert reader.read_seat(3, node) == Seat(3, rank, size)
    # A node of the wait list has no answer: it was not seated in that round.
    assert reader.read_seat(3, outcome.wait_list[0]) is None
    assert reader.read_roster(3).participants == outcome.participants


def test_a_second_publication_keeps_the_first_outcome(server: TCPStore):
    board = RendezvousBoard(server.clone(), "twice")
    first = board.publish(completed(3))
    assert board.publish(RoundOutcome(3, closed=True)) == first


def test_a_round_published_again_after_a_participant_left_keeps_what_nodes_were_told(
    server: TCPStore,
):
    # A steward taking office publishes the round of its state again; a
    # participant that left since is not in it, but the nodes were told it was.
    board = RendezvousBoard(server.clone(), "again")
    told = completed(4)
    board.publish(told)
    state = RendezvousState(
        round=3,
        complete=True,
        participants={node: rank for rank, node in enumerate(told.participants[:3])},
        last_order=list(told.participants[:3]),
    )
    board.publish(state.outcome())
    assert board.read_roster(3).participants == told.participants
    assert board.read_seat(3, told.participants[3]) == Seat(3, 3, 4)


def test_an_answer_for_another_round_is_a_state_error(server: TCPStore):
    board = RendezvousBoard(server.clone(), "odd")
    node = _NodeDesc("a", 1, 0)
    key = board.keys.answer(5, node.key)
    server.set(key, encode_answer(Seat(4, 0, 1)))
    # SET has no answer: the board's read on its own connection could overtake it.
    assert server.check([key])
    with pytest.raises(RendezvousStateError, match="answers for round 4"):
        board.read_seat(5, node)


def _requests(server: TCPStore, before: dict[str, int]) -> dict[str, int]:
    """The requests the server served since ``before`` (its ``ops``), but the STATS."""
    after = server.server_stats()["ops"]
    served = {op: n - before.get(op, 0) for op, n in after.items() if n != before.get(op, 0)}
    served["stats"] -= 1
    return {op: n for op, n in served.items() if n}


def test_a_node_learns_its_seat_or_that_it_has_none_in_one_request(server: TCPStore):
    outcome = completed(5, waiting=1)
    RendezvousBoard(server.clone(), "one").publish(outcome)
    reader = RendezvousBoard(server.clone(), "one")
    before = server.server_stats()["ops"]
    assert reader.await_round(3, outcome.participants[4], 1) == Seat(3, 4, 5)
    assert _requests(server, before) == {"wait_any": 1}
    # A node of the wait list: the outcome, complete without it.
    before = server.server_stats()["ops"]
    found = reader.await_round(3, outcome.wait_list[0], 1)
    assert isinstance(found, RoundOutcome)
    assert (found.round, found.world_size) == (3, 5)
    assert _requests(server, before) == {"wait_any": 1}


def test_a_waiting_node_wakes_with_its_seat_once_the_round_is_published(server: TCPStore):
    outcome = completed(3)
    reader = RendezvousBoard(server.clone(), "later")
    answers: list[object] = []
    waiter = threading.Thread(
        target=lambda: answers.append(reader.await_round(3, outcome.participants[1], 30))
    )
    waiter.start()
    RendezvousBoard(server.clone(), "later").publish(outcome)
    waiter.join(30)
    assert answers == [Seat(3, 1, 3)]


def test_a_waiting_node_wakes_when_the_stewards_session_ends(server: TCPStore):
    steward = RendezvousBoard(server.clone(), "vacancy")
    session = steward.open_session(60, "the steward's session")
    assert session is not None
    steward.leave_vacancy_will(session, 7)
    reader = RendezvousBoard(server.clone(), "vacancy")
    node = _NodeDesc("a", 1, 0)
    answers: list[object] = []
    waiter = threading.Thread(target=lambda: answers.append(reader.await_round(3, node, 30, 7)))
    waiter.start()
    session.close()
    waiter.join(30)
    assert answers == [VACATED]
    # The vacancy of another epoch does not end a wait.
    assert reader.await_round(3, node, 0.1, 8) is None


def test_a_store_that_cannot_wait_for_either_key_reads_the_outcome_then_the_seat(
    tmp_path: Path,
):
    store = FileStore(str(tmp_path / "store"), 1)
    outcome = completed(2, waiting=1)
    RendezvousBoard(store, "file").publish(outcome)
    reader = RendezvousBoard(FileStore(str(tmp_path / "store"), 1), "file")
    assert reader.await_round(3, outcome.participants[1], 1) is None  # it said it cannot
    assert not reader.waits_for_either
    assert reader.await_round(3, outcome.participants[1], 1) == Seat(3, 1, 2)
    found = reader.await_round(3, outcome.wait_list[0], 1)
    assert isinstance(found, RoundOutcome)
    assert found.world_size == 2


def test_an_answer_for_another_round_ends_a_wait_as_a_state_error(server: TCPStore):
    board = RendezvousBoard(server.clone(), "odd-wait")
    node = _NodeDesc("a", 1, 0)
    server.set(board.keys.answer(5, node.key), encode_answer(Seat(4, 0, 1)))
    with pytest.raises(RendezvousStateError, match="answers for round 4"):
        board.await_round(5, node, 10)
