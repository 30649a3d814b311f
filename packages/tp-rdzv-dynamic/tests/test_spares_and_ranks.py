"""Spares and ranks: the steward's pure decisions over random runs, and a spare's deadline.

A spare is a node beyond ``max_nodes`` waiting in the redundancy list. When a
participant dies, spares fill the next round to ``max_nodes`` without a last
call; with ``stable_ranks`` the survivors keep their ranks and the spares take
the dead nodes' ones. A spare never times out while it waits (the node
processes of ``test_dynamic_multiprocess.py`` show it across processes).
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import hypothesis
import pytest
from hypothesis import strategies as st

from tp_rdzv_dynamic import TpRendezvousBackend
from tp_rdzv_dynamic.backends.holder import _RendezvousStateHolder
from tp_rdzv_dynamic.model.decisions import (
    Join,
    Leave,
    Message,
    apply,
    assign_ranks,
    needs_last_call,
)
from tp_rdzv_dynamic.model.node_desc import _NodeDesc
from tp_rdzv_dynamic.model.state import RendezvousState, RoundOutcome
from tp_rdzv_dynamic.node.spares import JoinDeadline
from tp_rdzv_dynamic.settings import RendezvousSettings

NODES = [_NodeDesc(f"host{i}", 100 + i, 0) for i in range(10)]
A, B, C, D, E, F = NODES[:6]


def rules(min_nodes: int, max_nodes: int, *, stable: bool) -> RendezvousSettings:
    settings = RendezvousSettings(run_id="run", min_nodes=min_nodes, max_nodes=max_nodes)
    return settings.with_stable_ranks(stable)


def check_outcome(outcome: RoundOutcome, settings: RendezvousSettings) -> None:
    """Ranks are exactly ``0..n-1``, once each, in the published order."""
    world = len(outcome.participants)
    assert settings.min_nodes <= world <= settings.max_nodes
    assert len(set(outcome.participants)) == world
    assert sorted(outcome.ranks.values()) == list(range(world))
    assert [outcome.ranks[node] for node in outcome.participants] == list(range(world))


@st.composite
def runs(
    draw: st.DrawFn, *, hints: bool, stable: bool | None = None
) -> tuple[RendezvousSettings, list[tuple[list, bool]]]:
    """Settings and batches of joins and leaves, as a steward decides them.

    ``stable``: stable ranks on or off; drawn when ``None``.
    """
    max_nodes = draw(st.integers(1, 6), "max_nodes")
    settings = rules(
        draw(st.integers(1, max_nodes), "min_nodes"),
        max_nodes,
        stable=draw(st.booleans(), "stable_ranks") if stable is None else stable,
    )
    who = st.sampled_from(NODES[:8])
    hint = st.none() | st.integers(0, 6) if hints else st.none()
    message = st.one_of(
        st.builds(Leave, who),
        # A join for the round after any completed one: survivors re-join.
        st.builds(Join, who, hint, st.just(10**6)),
    )
    batches = draw(
        st.lists(st.tuples(st.lists(message, max_size=6), st.booleans()), min_size=1, max_size=12)
    )
    return settings, batches


def play(settings, batches):
    """Every transition of the run: (state after it, its outcomes)."""
    state = RendezvousState()
    for events, expired in batches:
        transition = apply(state, events, settings, last_call_expired=expired)
        state = transition.state
        yield state, transition.outcomes


@hypothesis.settings(deadline=None, max_examples=400)
@hypothesis.given(runs(hints=True))
def test_every_round_has_ranks_zero_to_n_minus_one(run):
    settings, batches = run
    for state, outcomes in play(settings, batches):
        for outcome in outcomes:
            if not outcome.closed:
                check_outcome(outcome, settings)
        if not state.complete:
            # An open round never holds max_nodes: at max it completes, no last call.
            assert len(state.participants) < settings.max_nodes


@hypothesis.settings(deadline=None, max_examples=400)
@hypothesis.given(runs(hints=False, stable=True))
def test_with_stable_ranks_survivors_keep_their_ranks(run):
    settings, batches = run
    previous: dict[_NodeDesc, int] = {}
    for _, outcomes in play(settings, batches):
        for outcome in outcomes:
            world = len(outcome.participants)
            kept = {node: rank for node, rank in previous.items() if node in outcome.ranks}
            for node, rank in kept.items():
                if rank < world:
                    assert outcome.ranks[node] == rank, (node, previous, outcome.ranks)
            # The others take the lowest ranks the survivors left free.
            others = sorted(r for n, r in outcome.ranks.items() if kept.get(n, world) >= world)
            free = [r for r in range(world) if r not in {r for r in kept.values() if r < world}]
            assert others == free
            previous = dict(outcome.ranks)


@hypothesis.settings(deadline=None, max_examples=400)
@hypothesis.given(runs(hints=True, stable=True))
def test_with_stable_ranks_hints_come_first_then_survivors_keep_their_ranks(run):
    settings, batches = run
    state, previous = RendezvousState(), {}
    for events, expired in batches:
        # One event at a time (the same decisions): the hints of the moment a
        # round completes are the state's right after that event.
        for step, last_call in [*(([event], False) for event in events), ([], expired)]:
            transition = apply(state, step, settings, last_call_expired=last_call)
            state = transition.state
            for outcome in transition.outcomes:
                ranks, world = outcome.ranks, len(outcome.participants)
                asked = {node: state.hints[node] for node in ranks if node in state.hints}
                shared = Counter(asked.values())
                honoured = {n: h for n, h in asked.items() if h < world and shared[h] == 1}
                for node, hint in honoured.items():
                    assert ranks[node] == hint
                for node, rank in previous.items():
                    kept = rank < world and rank not in honoured.values()
                    if node in ranks and node not in honoured and kept:
                        assert ranks[node] == rank, (node, previous, ranks, honoured)
                previous = dict(ranks)


@hypothesis.settings(deadline=None, max_examples=400)
@hypothesis.given(st.data())
def test_spares_fill_the_dead_nodes_places_without_a_last_call(data):
    max_nodes = data.draw(st.integers(1, 6), "max_nodes")
    stable = data.draw(st.booleans(), "stable_ranks")
    settings = rules(data.draw(st.integers(1, max_nodes), "min_nodes"), max_nodes, stable=stable)
    members = data.draw(st.permutations(NODES[:max_nodes]), "join order")
    spares = data.draw(
        st.lists(
            st.sampled_from(NODES[max_nodes:]), min_size=1, max_size=10 - max_nodes, unique=True
        ),
        "spares in arrival order",
    )
    first = apply(RendezvousState(), [Join(node) for node in [*members, *spares]], settings)
    (round0,) = first.outcomes
    assert list(first.state.redundancy_list) == spares
    dead = data.draw(
        st.lists(st.sampled_from(members), min_size=1, max_size=len(spares), unique=True), "dead"
    )
    survivors = [node for node in members if node not in dead]
    # The steward finds the dead and the survivors re-join, in any order and batching.
    events: list[Message] = [*map(Leave, dead), *(Join(node, None, 1) for node in survivors)]
    events = data.draw(st.permutations(events), "order")
    cuts = sorted(data.draw(st.lists(st.integers(0, len(events)), max_size=3), "batches"))
    state, outcomes = first.state, []
    for start, end in zip([0, *cuts], [*cuts, len(events)], strict=True):
        transition = apply(state, events[start:end], settings)  # the last call never expires
        state = transition.state
        outcomes.extend(transition.outcomes)
        assert not needs_last_call(state, settings)
    (round1,) = outcomes
    assert state.round == 1
    assert state.complete
    seated = spares[: len(dead)]  # the spares that waited longest
    assert set(round1.participants) == {*survivors, *seated}
    assert list(state.redundancy_list) == spares[len(dead) :]
    if stable:
        for node in survivors:
            assert round1.ranks[node] == round0.ranks[node]
        assert {round1.ranks[node] for node in seated} == {round0.ranks[node] for node in dead}


def test_stable_ranks_are_off_by_default():
    assert RendezvousSettings(run_id="run").stable_ranks is False
    # Today's order: survivors close up in their old order, the newcomer last.
    assert assign_ranks([A, C, D, E], {}, [A, B, C, D]) == [A, C, D, E]


@pytest.mark.parametrize(
    ("members", "hints", "previous", "expected"),
    [
        # B died, E took its place: everyone else where they were.
        ([A, C, D, E], {}, [A, B, C, D], [A, E, C, D]),
        # Shrinking: D's rank 3 is beyond the world of 3; it takes the free 1.
        ([A, C, D], {}, [A, B, C, D], [A, D, C]),
        # Growing: survivors stay, newcomers above them in natural order.
        ([F, B, A, E], {}, [B, A], [B, A, E, F]),
        # A hint comes first: C asks for 0, so A moves to the lowest free rank.
        ([A, B, C], {C: 0}, [A, B, C], [C, B, A]),
        # A shared hint is nobody's: the survivors keep their ranks.
        ([A, B, C], {B: 2, C: 2}, [A, B, C], [A, B, C]),
    ],
)
def test_stable_ranks(members, hints, previous, expected):
    assert assign_ranks(members, hints, previous, stable=True) == expected


@pytest.mark.parametrize(("stable", "expected"), [(True, (D, B, C)), (False, (B, C, D))])
def test_a_spare_takes_the_dead_nodes_place(stable, expected):
    settings = rules(1, 3, stable=stable)
    state = apply(RendezvousState(), [Join(C), Join(A), Join(B), Join(D)], settings).state
    assert state.in_rank_order() == [A, B, C]
    assert list(state.redundancy_list) == [D]
    transition = apply(state, [Leave(A), Join(B, None, 1), Join(C, None, 1)], settings)
    # Stable: D has A's rank 0. Otherwise the survivors close up and D goes last.
    assert transition.outcomes[0].participants == expected


def test_the_last_survivor_back_is_seated_before_the_spares():
    # max 2: A and B ran, C and D wait as spares; A dies, then B re-joins. B's
    # re-join opens round 1: it must be a candidate then, not a latecomer
    # finding two spares in its seats.
    settings = rules(1, 2, stable=False)
    state = apply(RendezvousState(), [Join(A), Join(B), Join(C), Join(D)], settings).state
    transition = apply(state, [Leave(A), Join(B, None, 1)], settings)
    assert transition.outcomes[0].participants == (B, C)
    assert list(transition.state.redundancy_list) == [D]


def test_a_spare_has_no_join_deadline_and_a_former_spare_a_whole_one(server):
    backend = TpRendezvousBackend(server, "spares")
    holder = _RendezvousStateHolder(backend, "spares")
    spare = RendezvousState(
        complete=True, participants={A: 0, B: 1}, redundancy_list={C: None}, last_order=[A, B]
    )
    _, token, _ = holder.save(spare, None)
    deadline = JoinDeadline(C, holder, timedelta(seconds=10), now=100.0)
    assert not deadline.expired(109.0)  # before the deadline: nothing read
    assert deadline.remaining(109.0) == 1.0
    assert not deadline.expired(110.0)  # a spare: a new join timeout
    assert deadline.remaining(110.0) == 10.0
    assert not deadline.expired(120.0)
    # B dies: C moves to the wait list, at some point of the last join timeout.
    spare = apply(spare, [Leave(B)], rules(1, 2, stable=False)).state
    assert list(spare.wait_list) == [C]
    holder.save(spare, token)
    assert not deadline.expired(130.0)  # a spare at the last look: a whole join timeout
    assert deadline.expired(140.0)  # waiting, no spare: it gives up as any node


def test_a_node_that_is_no_spare_gives_up_at_the_join_timeout(server):
    holder = _RendezvousStateHolder(TpRendezvousBackend(server, "waiting"), "waiting")
    holder.save(RendezvousState(participants={A: 0}), None)
    deadline = JoinDeadline(B, holder, timedelta(seconds=10), now=0.0)
    assert deadline.expired(10.0)
