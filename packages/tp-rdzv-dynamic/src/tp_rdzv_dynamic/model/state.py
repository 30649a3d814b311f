"""The values the steward decides: the rendezvous state and the outcome of a round.

How they are written to the store, and read back, is :mod:`.documents`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .node_desc import _NodeDesc


@dataclass
class RendezvousState:
    """What the steward decides and persists.

    Attributes:
        round: the current round.
        complete: whether the current round has completed.
        closed: whether the rendezvous is closed.
        participants: the nodes of the current round and their ranks (ranks
            are meaningful once ``complete``; before, the order is join order).
        wait_list: nodes waiting for the next round (an insertion-ordered set).
        redundancy_list: nodes beyond ``max_nodes`` waiting for a free slot.
        hints: the ``node_rank`` each node asked for.
        last_order: the previous completed round's participants, in rank order.
        epoch: the steward generation that wrote this state (fencing).
    """

    round: int = 0
    complete: bool = False
    closed: bool = False
    participants: dict[_NodeDesc, int] = field(default_factory=dict)
    wait_list: dict[_NodeDesc, None] = field(default_factory=dict)
    redundancy_list: dict[_NodeDesc, None] = field(default_factory=dict)
    hints: dict[_NodeDesc, int] = field(default_factory=dict)
    last_order: list[_NodeDesc] = field(default_factory=list)
    epoch: int = 0

    def copy(self) -> RendezvousState:
        """A copy whose collections can be changed independently."""
        return RendezvousState(
            round=self.round,
            complete=self.complete,
            closed=self.closed,
            participants=dict(self.participants),
            wait_list=dict(self.wait_list),
            redundancy_list=dict(self.redundancy_list),
            hints=dict(self.hints),
            last_order=list(self.last_order),
            epoch=self.epoch,
        )

    def members(self) -> Iterable[_NodeDesc]:
        """Every node the state knows: participants, then the wait and redundancy lists."""
        yield from self.participants
        yield from self.wait_list
        yield from self.redundancy_list

    def in_rank_order(self) -> list[_NodeDesc]:
        """The participants sorted by rank."""
        return sorted(self.participants, key=self.participants.__getitem__)

    @property
    def waiting_round(self) -> int:
        """The round a joining node waits for: the open one, or the one after a completed one."""
        return self.round + 1 if self.complete else self.round

    def outcome(self) -> RoundOutcome:
        """The outcome of the completed round, as every node of it reads it."""
        return RoundOutcome(
            self.round,
            closed=False,
            participants=tuple(self.in_rank_order()),
            wait_list=tuple(self.wait_list),
            redundancy_list=tuple(self.redundancy_list),
            world_size=len(self.participants),
        )


@dataclass(frozen=True)
class RoundOutcome:
    """How a round ended, as published to every node.

    Attributes:
        round: the round.
        closed: the rendezvous closed instead of completing this round.
        participants: the nodes in rank order (empty when closed, and in an
            outcome read from the store: the lists travel in the round's
            roster, each node's rank in its own answer).
        wait_list: the nodes waiting for the next round when it completed.
        redundancy_list: the nodes beyond ``max_nodes`` when it completed.
        error: why the steward could not decide this round (the state is
            corrupt), or ``None``.
        world_size: the number of participants of a completed round.
    """

    round: int
    closed: bool
    participants: tuple[_NodeDesc, ...] = ()
    wait_list: tuple[_NodeDesc, ...] = ()
    redundancy_list: tuple[_NodeDesc, ...] = ()
    error: str | None = None
    world_size: int = 0

    @property
    def ranks(self) -> dict[_NodeDesc, int]:
        """Each participant's rank."""
        return {node: rank for rank, node in enumerate(self.participants)}
