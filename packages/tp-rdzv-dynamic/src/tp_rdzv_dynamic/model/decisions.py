"""The steward's decisions: a pure function from (state, messages) to the next state.

No I/O and no clocks here: the executor (:mod:`.steward`) reads the mailbox,
samples heartbeats and runs the last-call timer, then asks :func:`apply` what
the state becomes; ``set_closed`` asks it what closing does. Everything is
linear in the batch, except completing a round (a sort of its participants).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tp_rdzv_dynamic.settings import RendezvousSettings

from .node_desc import _NodeDesc, natural_key
from .state import RendezvousState, RoundOutcome


@dataclass(frozen=True)
class Join:
    """``node`` wants a seat in round ``round`` or a later one.

    ``hint`` is the ``node_rank`` it asks for. A join for a round that has
    already completed with ``node`` in it is a repeat of a join the steward
    already granted (nodes re-post to every new steward), not a request for
    the next round.
    """

    node: _NodeDesc
    hint: int | None = None
    round: int = 0


@dataclass(frozen=True)
class Leave:
    """``node`` is gone: it left, rolled back a timed-out join, or was found dead."""

    node: _NodeDesc


@dataclass(frozen=True)
class Close:
    """The rendezvous closes: no round completes any more, and its waiting nodes are told."""


#: What a node posts to the mailbox.
Message = Join | Leave
Event = Join | Leave | Close


@dataclass(frozen=True)
class Transition:
    """What a batch did: the new state, and the outcomes to publish.

    ``outcomes`` holds the outcome of each round the batch completed, taken
    when it completed (a later event of the batch may already have opened the
    next round), or closed.
    """

    state: RendezvousState
    outcomes: tuple[RoundOutcome, ...] = ()
    opened: tuple[int, ...] = ()

    @property
    def completed(self) -> tuple[int, ...]:
        """The rounds this batch completed."""
        return tuple(outcome.round for outcome in self.outcomes if not outcome.closed)


def needs_last_call(state: RendezvousState, settings: RendezvousSettings) -> bool:
    """Whether the open round has enough nodes and only waits for the last call."""
    return (
        not state.complete
        and not state.closed
        and settings.min_nodes <= len(state.participants) < settings.max_nodes
    )


def apply(
    state: RendezvousState,
    events: Iterable[Event],
    settings: RendezvousSettings,
    *,
    last_call_expired: bool = False,
) -> Transition:
    """The state after ``events`` (in order), and after the last call if it expired.

    ``state`` is not modified.
    """
    batch = _Batch(state.copy(), settings)
    for event in events:
        if isinstance(event, Join):
            batch.join(event.node, event.hint, event.round)
        elif isinstance(event, Leave):
            batch.leave(event.node)
        else:
            batch.close()
    if last_call_expired and needs_last_call(batch.state, settings):
        batch.complete_round()
    return Transition(batch.state, tuple(batch.outcomes), tuple(batch.opened))


class _Batch:
    """The state being changed by one batch of events."""

    def __init__(self, state: RendezvousState, settings: RendezvousSettings) -> None:
        self.state = state
        self.settings = settings
        self.outcomes: list[RoundOutcome] = []
        self.opened: list[int] = []

    def join(self, node: _NodeDesc, hint: int | None, round_: int) -> None:
        state = self.state
        if state.closed:
            return
        rejoining = node in state.participants
        if rejoining and (not state.complete or round_ <= state.round):
            return  # already gathered for the open round, or seated in this one
        if hint is None:
            state.hints.pop(node, None)
        else:
            state.hints[node] = hint
        if rejoining:
            # A participant of the completed round asks for the next one: it
            # leaves this round (PyTorch's exit-then-join) as a candidate for
            # the next, so that the last survivor back is seated before spares.
            state.wait_list[node] = None
            self._remove_participant(node)
            return
        if node in state.wait_list or node in state.redundancy_list:
            return
        if not state.complete:
            state.participants[node] = 0
            if len(state.participants) >= self.settings.max_nodes:
                self.complete_round()
        elif len(state.participants) < self.settings.max_nodes:
            state.wait_list[node] = None
        else:
            state.redundancy_list[node] = None

    def leave(self, node: _NodeDesc) -> None:
        state = self.state
        state.hints.pop(node, None)
        state.wait_list.pop(node, None)
        state.redundancy_list.pop(node, None)
        if node in state.participants:
            self._remove_participant(node)

    def close(self) -> None:
        """Close, and tell whoever waits for the open round or the one after it.

        Closing a closed rendezvous tells them again: a node that recorded
        the closing may have died before publishing it.
        """
        state = self.state
        state.closed = True
        first = state.waiting_round
        self.outcomes.extend(RoundOutcome(round_, closed=True) for round_ in (first, first + 1))

    def _remove_participant(self, node: _NodeDesc) -> None:
        state = self.state
        del state.participants[node]
        if not state.complete:
            return
        if not state.participants:
            self._open_next_round()
        elif state.redundancy_list and len(state.participants) < self.settings.max_nodes:
            # A slot opened: the spares now wait for the next round like late joiners.
            state.wait_list.update(state.redundancy_list)
            state.redundancy_list.clear()

    def _open_next_round(self) -> None:
        state = self.state
        state.round += 1
        state.complete = False
        self.opened.append(state.round)
        previous = {node: index for index, node in enumerate(state.last_order)}
        # Survivors of the last round first, in their old order, then the rest
        # in arrival order: who gets a seat when there are more than max_nodes.
        candidates = sorted(
            [*state.wait_list, *state.redundancy_list],
            key=lambda node: previous.get(node, len(previous)),
        )
        seats = self.settings.max_nodes
        state.participants = dict.fromkeys(candidates[:seats], 0)
        state.wait_list = {}
        state.redundancy_list = dict.fromkeys(candidates[seats:])
        if state.closed:
            return
        if len(state.participants) >= seats:
            self.complete_round()

    def complete_round(self) -> None:
        state = self.state
        order = assign_ranks(
            state.participants,
            state.hints,
            state.last_order,
            stable=self.settings.stable_ranks,
        )
        state.participants = {node: rank for rank, node in enumerate(order)}
        state.complete = True
        state.last_order = order
        self.outcomes.append(state.outcome())


def assign_ranks(
    nodes: Iterable[_NodeDesc],
    hints: Mapping[_NodeDesc, int],
    previous_order: Sequence[_NodeDesc],
    *,
    stable: bool = False,
) -> list[_NodeDesc]:
    """``nodes`` in rank order; ``previous_order`` is the previous round's, by rank.

    A ``node_rank`` hint below the world size that no other node of the round
    shares is honoured first. With ``stable``, a survivor of the previous
    round then keeps its rank if it is below the world size and no hint took
    it. The ranks left go, lowest first, to the other survivors in their
    previous order, then to newcomers in the natural order of
    ``(addr, pid, local_id)``: a newcomer replacing a dead node (a spare)
    takes its rank.
    """
    members = list(nodes)
    world_size = len(members)
    asked = {node: hints[node] for node in members if node in hints}
    counts = Counter(asked.values())
    fixed = {
        rank: node for node, rank in asked.items() if 0 <= rank < world_size and counts[rank] == 1
    }
    placed = set(fixed.values())
    previous = {node: index for index, node in enumerate(previous_order)}
    if stable:
        for node in members:
            rank = previous.get(node, world_size)
            if rank < world_size and rank not in fixed and node not in placed:
                fixed[rank] = node
                placed.add(node)
    survivors = sorted(
        (n for n in members if n in previous and n not in placed), key=previous.__getitem__
    )
    newcomers = sorted(
        (n for n in members if n not in previous and n not in placed), key=natural_key
    )
    rest = iter([*survivors, *newcomers])
    return [fixed[rank] if rank in fixed else next(rest) for rank in range(world_size)]
