"""The steward's decisions as a pure function: state + messages -> next state."""

from __future__ import annotations

import json

import hypothesis
import pytest
from hypothesis import strategies as st

from tp_rdzv_dynamic.model.decisions import (
    Close,
    Join,
    Leave,
    Message,
    apply,
    assign_ranks,
    needs_last_call,
)
from tp_rdzv_dynamic.model.node_desc import _NodeDesc
from tp_rdzv_dynamic.model.state import RendezvousState
from tp_rdzv_dynamic.settings import RendezvousSettings


def node(name: str, pid: int = 1, local_id: int = 0) -> _NodeDesc:
    return _NodeDesc(name, pid, local_id)


A, B, C, D, E, F = (node(f"host{i}") for i in range(1, 7))


def settings(min_nodes: int, max_nodes: int) -> RendezvousSettings:
    return RendezvousSettings(run_id="run", min_nodes=min_nodes, max_nodes=max_nodes)


def complete_round(*nodes: _NodeDesc, round_: int = 0) -> RendezvousState:
    """A completed round with ``nodes`` at ranks 0.."""
    return RendezvousState(
        round=round_,
        complete=True,
        participants={n: rank for rank, n in enumerate(nodes)},
        last_order=list(nodes),
    )


def open_round(*nodes: _NodeDesc, round_: int = 0) -> RendezvousState:
    return RendezvousState(round=round_, participants=dict.fromkeys(nodes, 0))


def ranks(state: RendezvousState) -> list[_NodeDesc]:
    return state.in_rank_order()


# (name, min, max, start state, events, last call expired, expected
#  (round, complete, participants in rank/join order, wait list, redundancy list))
CASES = [
    (
        "first join opens round 0",
        1,
        3,
        RendezvousState(),
        [Join(A)],
        False,
        (0, False, [A], [], []),
    ),
    ("joins gather until max", 2, 3, open_round(A), [Join(B)], False, (0, False, [A, B], [], [])),
    (
        "reaching max completes at once",
        2,
        3,
        open_round(A, B),
        [Join(C)],
        False,
        (0, True, [A, B, C], [], []),
    ),
    (
        "min reached: the last call completes",
        2,
        3,
        open_round(A, B),
        [],
        True,
        (0, True, [A, B], [], []),
    ),
    (
        "last call below min does nothing",
        3,
        4,
        open_round(A, B),
        [],
        True,
        (0, False, [A, B], [], []),
    ),
    (
        "a join twice is one join",
        1,
        3,
        open_round(A),
        [Join(A), Join(A)],
        False,
        (0, False, [A], [], []),
    ),
    (
        "late joiner waits in the wait list",
        1,
        3,
        complete_round(A, B),
        [Join(C)],
        False,
        (0, True, [A, B], [C], []),
    ),
    (
        "beyond max: the redundancy list",
        1,
        2,
        complete_round(A, B),
        [Join(C)],
        False,
        (0, True, [A, B], [], [C]),
    ),
    (
        "a participant re-joining leaves its round first",
        1,
        3,
        complete_round(A, B),
        [Join(A, round=1)],
        False,
        (0, True, [B], [A], []),
    ),
    (
        "a repeated join for the round it completed is no re-join",
        1,
        3,
        complete_round(A, B),
        [Join(A, round=0), Join(B, round=0)],
        False,
        (0, True, [A, B], [], []),
    ),
    (
        "the last participant re-joining opens the next round",
        1,
        3,
        complete_round(A, B),
        [Join(A, round=1), Join(B, round=1)],
        False,
        (1, False, [A, B], [], []),
    ),
    (
        "every participant back at max: the next round completes at once",
        1,
        2,
        complete_round(A, B),
        [Join(B, round=1), Join(A, round=1)],
        False,
        (1, True, [A, B], [], []),
    ),
    (
        "a dead participant frees a slot: spares move to the wait list",
        1,
        2,
        RendezvousState(
            complete=True, participants={A: 0, B: 1}, redundancy_list={C: None}, last_order=[A, B]
        ),
        [Leave(B)],
        False,
        (0, True, [A], [C], []),
    ),
    (
        "the last participant dead: waiting nodes form the next round",
        2,
        4,
        RendezvousState(
            complete=True, participants={A: 0}, wait_list={C: None, D: None}, last_order=[A]
        ),
        [Leave(A)],
        False,
        (1, False, [C, D], [], []),
    ),
    (
        "a leave from the wait list",
        1,
        3,
        RendezvousState(complete=True, participants={A: 0}, wait_list={B: None}),
        [Leave(B)],
        False,
        (0, True, [A], [], []),
    ),
    (
        "a leave from the redundancy list",
        1,
        1,
        RendezvousState(complete=True, participants={A: 0}, redundancy_list={B: None}),
        [Leave(B)],
        False,
        (0, True, [A], [], []),
    ),
    (
        "a leave of an unknown node changes nothing",
        1,
        3,
        open_round(A),
        [Leave(B)],
        False,
        (0, False, [A], [], []),
    ),
    (
        "a leave in the open round",
        1,
        3,
        open_round(A, B),
        [Leave(A)],
        False,
        (0, False, [B], [], []),
    ),
    (
        "more candidates than seats: survivors first, the rest are spares",
        1,
        2,
        RendezvousState(
            complete=True,
            participants={A: 0},
            wait_list={D: None, B: None, C: None},
            last_order=[C, A, B],
        ),
        [Leave(A)],
        False,
        (1, True, [C, B], [], [D]),
    ),
]


@pytest.mark.parametrize(
    ("min_nodes", "max_nodes", "start", "events", "expired", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_transitions(  # noqa: PLR0917 - pytest passes the table's columns
    min_nodes, max_nodes, start, events, expired, expected
):
    before = json.dumps(repr(start))
    transition = apply(start, events, settings(min_nodes, max_nodes), last_call_expired=expired)
    state = transition.state
    round_, complete, participants, wait_list, redundancy = expected
    assert state.round == round_
    assert state.complete is complete
    assert (ranks(state) if complete else list(state.participants)) == participants
    assert list(state.wait_list) == wait_list
    assert list(state.redundancy_list) == redundancy
    assert json.dumps(repr(start)) == before, "apply changed its input"


def test_closed_rendezvous_takes_no_one():
    start = open_round(A)
    start.closed = True
    state = apply(start, [Join(B), Join(C)], settings(1, 2)).state
    assert list(state.participants) == [A]
    assert not state.complete
    assert not needs_last_call(state, settings(1, 2))


def test_completion_publishes_the_outcome_of_that_moment():
    # Round 0 completes at max, then its only participants die in the same batch.
    transition = apply(open_round(A), [Join(B), Leave(A), Leave(B)], settings(1, 2))
    assert transition.completed == (0,)
    (outcome,) = transition.outcomes
    assert outcome.round == 0
    assert outcome.participants == (A, B)
    assert outcome.ranks == {A: 0, B: 1}
    assert outcome.world_size == 2
    assert transition.state.round == 1
    assert transition.opened == (1,)


@pytest.mark.parametrize(
    ("start", "told"),
    [
        (open_round(A, round_=2), (2, 3)),  # the nodes gathering for round 2
        (complete_round(A, B, round_=2), (3, 4)),  # the next joiners, of round 3
    ],
)
def test_closing_tells_the_nodes_waiting_for_a_round(start, told):
    transition = apply(start, [Close()], settings(1, 3))
    assert transition.state.closed
    assert [(o.round, o.closed) for o in transition.outcomes] == [(r, True) for r in told]
    assert transition.completed == ()
    assert not start.closed  # the state given is not modified


def test_after_closing_nobody_joins_and_no_round_completes():
    transition = apply(open_round(A), [Close(), Join(B), Join(C)], settings(1, 2))
    assert list(transition.state.participants) == [A]
    assert transition.completed == ()
    assert not needs_last_call(transition.state, settings(1, 2))


def test_closing_a_closed_rendezvous_tells_the_waiting_nodes_again():
    # The node that recorded the closing may have died before publishing it.
    closed = apply(open_round(A), [Close()], settings(1, 3)).state
    again = apply(closed, [Close()], settings(1, 3))
    assert again.state == closed
    assert [o.round for o in again.outcomes] == [0, 1]


@pytest.mark.parametrize(
    ("participants", "complete", "expected"),
    [(1, False, False), (2, False, True), (3, False, True), (4, False, False), (2, True, False)],
)
def test_needs_last_call_between_min_and_max(participants, complete, expected):
    nodes = [node(f"n{i}") for i in range(participants)]
    state = RendezvousState(complete=complete, participants=dict.fromkeys(nodes, 0))
    assert needs_last_call(state, settings(2, 4)) is expected


def test_natural_order_of_addresses():
    nodes = [node("node10"), node("node2"), node("node1"), node("Node3")]
    assert [n.addr for n in assign_ranks(nodes, {}, [])] == ["node1", "node2", "Node3", "node10"]


def test_natural_order_counts_only_ascii_digits_as_numbers():
    # "²" and "٣" are digits to str.isdigit() but not numbers here; a run of
    # 5000 digits is too long for int() yet still orders by value.
    long_run = "n" + "9" * 5000
    names = [long_run, "node1\N{SUPERSCRIPT TWO}", "n010", "node2", "n9", "node\u0663", "n"]
    nodes = [node(name) for name in names]
    expected = ["n", "n9", "n010", long_run, "node1\N{SUPERSCRIPT TWO}", "node2", "node\u0663"]
    assert [n.addr for n in assign_ranks(nodes, {}, [])] == expected


def test_natural_order_then_pid_then_local_id():
    nodes = [node("h", 20, 1), node("h", 3, 5), node("h", 20, 0), node("h", 100, 0)]
    expected = [node("h", 3, 5), node("h", 20, 0), node("h", 20, 1), node("h", 100, 0)]
    assert assign_ranks(nodes, {}, []) == expected


@pytest.mark.parametrize(
    ("hints", "expected"),
    [
        ({A: 2, B: 0}, [B, C, A]),  # distinct hints honoured
        ({A: 1, B: 1}, [A, B, C]),  # a shared hint is nobody's
        ({C: 7}, [A, B, C]),  # beyond the world size: ignored
        ({A: 0, B: 0, C: 0}, [A, B, C]),  # everyone at the default 0: natural order
        ({C: 0, A: 2, B: 1}, [C, B, A]),
    ],
)
def test_hints(hints, expected):
    assert assign_ranks([A, B, C], hints, []) == expected


def test_survivors_keep_their_relative_order():
    # Round 1 was [D, B, A] (by hints, say); C is new; B died.
    order = assign_ranks([A, C, D], {}, [D, B, A])
    assert order == [D, A, C]


def test_ranks_recorded_when_the_round_completes():
    state = apply(open_round(node("n10"), node("n2")), [Join(node("n1"))], settings(1, 3)).state
    assert state.complete
    assert {n.addr: r for n, r in state.participants.items()} == {"n1": 0, "n2": 1, "n10": 2}
    assert state.last_order == state.in_rank_order()


def test_join_records_and_clears_the_hint():
    state = apply(RendezvousState(), [Join(A, 3)], settings(1, 1)).state
    assert state.complete
    assert state.hints == {A: 3}
    state = apply(state, [Join(A, None, round=1)], settings(1, 1)).state
    assert state.round == 1
    assert state.hints == {}


def test_a_batch_of_4000_joins_completes_one_round():
    nodes = [node(f"n{i}") for i in range(4000)]
    transition = apply(RendezvousState(), [Join(n) for n in nodes], settings(1, 4000))
    assert transition.state.complete
    assert ranks(transition.state) == nodes


@hypothesis.settings(deadline=None, max_examples=300)
@hypothesis.given(st.data())
def test_a_message_decided_again_later_changes_nothing(data):
    """A steward that lost the lease puts back what it took, which the new one may
    have had from the sender too: the copy arrives later, after other nodes'
    messages (a node's own next message waits for the outcome of its join).
    """
    max_nodes = data.draw(st.integers(1, 3), "max_nodes")
    rules = settings(data.draw(st.integers(1, max_nodes), "min_nodes"), max_nodes)
    # Batches as a steward decides them: each node asks for a round no later
    # than the one the lease hinted when it posted (the waiting round, or before).
    batches: list[tuple[list[Message], bool]] = []
    state = RendezvousState()
    for _ in range(data.draw(st.integers(1, 6), "batches")):
        batch: list[Message] = []
        for _ in range(data.draw(st.integers(0, 5), "messages")):
            who = data.draw(st.sampled_from([A, B, C, D]))
            if data.draw(st.booleans(), "join"):
                hint = data.draw(st.none() | st.integers(0, 3), "hint")
                batch.append(Join(who, hint, data.draw(st.integers(0, state.waiting_round))))
            else:
                batch.append(Leave(who))
        expired = data.draw(st.booleans(), "last call expired")
        batches.append((batch, expired))
        state = apply(state, batch, rules, last_call_expired=expired).state
    places = [(b, i) for b, (batch, _) in enumerate(batches) for i in range(len(batch))]
    hypothesis.assume(places)
    first = data.draw(st.integers(0, len(places) - 1), "message decided twice")
    # The copy goes after any later message of the batches, or at the end of one.
    b, i = places[first]
    ends = [(later, len(batch)) for later, (batch, _) in enumerate(batches) if later >= b]
    again = data.draw(st.sampled_from(sorted({*places[first + 1 :], *ends})), "decided again at")
    message = batches[b][0][i]
    between = _flat(batches, (b, i + 1), again)
    hypothesis.assume(all(other.node != message.node for other in between))

    copied = [(list(batch), expired) for batch, expired in batches]
    copied[again[0]][0].insert(again[1], message)
    once, twice = RendezvousState(), RendezvousState()
    for (batch, expired), (batch2, _) in zip(batches, copied, strict=True):
        once = apply(once, batch, rules, last_call_expired=expired).state
        twice = apply(twice, batch2, rules, last_call_expired=expired).state
        assert twice == once


def _flat(batches, start, end):
    """The messages from place ``start`` (batch, index) up to, not including, ``end``."""
    for b, (batch, _) in enumerate(batches):
        for i, message in enumerate(batch):
            if start <= (b, i) < end:
                yield message
