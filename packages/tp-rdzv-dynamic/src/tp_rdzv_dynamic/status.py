"""What an observer sees of a run: the state, the steward, and the members' liveness.

The steward publishes what it knows of liveness
(:func:`~.documents.codecs.encode_liveness`): which members it watches through
their presence sessions (a store with sessions: the store tells it when one
ends), and for the others heartbeat ages. Heartbeats are counters, and wall
clocks of other hosts are never trusted, so an observer cannot tell from a
counter alone when it last moved: the steward, which samples them on its own
monotonic clock, reports the ages it measured, as of its last tick (at most
one ``keep_alive_interval`` old). :func:`build_status` joins the report with
the state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .backends.holder import _RendezvousStateHolder
from .documents.board import RendezvousBoard
from .documents.codecs import Lease, LivenessReport, decode_liveness
from .model.node_desc import _NodeDesc
from .model.state import RendezvousState


@dataclass(frozen=True)
class NodeStatus:
    """One node as an observer sees it.

    Attributes:
        node: the node's name (``str()`` of its descriptor).
        rank: its rank in the completed round, else ``None``.
        heartbeat_age: seconds since its heartbeat last moved, as the steward
            measured at its last tick; ``None`` before the steward saw it, and
            for a node watched through its presence session.
        present: whether the steward watches it through its presence session
            (then it is alive until the store ends that session: no age to report).
    """

    node: str
    rank: int | None
    heartbeat_age: float | None
    present: bool = False


@dataclass(frozen=True)
class RendezvousStatus:
    """A snapshot of one run, for people and scripts (``to_dict`` is JSON-ready).

    Attributes:
        run_id: the run.
        backend: the backend name.
        round: the current round.
        complete: whether that round has completed (ranks are final).
        closed: whether the rendezvous is closed.
        participants: the round's nodes, in rank order once complete.
        wait_list: nodes waiting for the next round.
        redundancy_list: nodes beyond ``max_nodes``, waiting for a free slot.
        steward: the node deciding for the run, or ``None`` when vacant.
        steward_epoch: the steward generation.
        exists: whether the store holds anything of the run (a state or a
            steward lease); a run nobody joined yet reads as round 0, empty.
    """

    run_id: str
    backend: str
    round: int
    complete: bool
    closed: bool
    participants: tuple[NodeStatus, ...]
    wait_list: tuple[NodeStatus, ...]
    redundancy_list: tuple[NodeStatus, ...]
    steward: str | None
    steward_epoch: int
    exists: bool = True

    def to_dict(self) -> dict[str, Any]:
        """The snapshot as plain JSON types."""
        return asdict(self)


def build_status(
    run_id: str,
    backend: str,
    state: RendezvousState,
    lease: Lease | None,
    liveness: LivenessReport | Mapping[str, float],
    *,
    exists: bool = True,
) -> RendezvousStatus:
    """Join the state, the lease and the steward's liveness report (or bare heartbeat
    ages) into a snapshot."""
    report = liveness if isinstance(liveness, LivenessReport) else LivenessReport(liveness)

    def describe(nodes: Iterable[_NodeDesc], ranked: bool) -> tuple[NodeStatus, ...]:
        return tuple(
            NodeStatus(
                node.key,
                state.participants[node] if ranked else None,
                report.ages.get(node.key),
                node.key in report.present,
            )
            for node in nodes
        )

    participants = state.in_rank_order() if state.complete else list(state.participants)
    return RendezvousStatus(
        run_id=run_id,
        backend=backend,
        round=state.round,
        complete=state.complete,
        closed=state.closed,
        participants=describe(participants, ranked=state.complete),
        wait_list=describe(state.wait_list, ranked=False),
        redundancy_list=describe(state.redundancy_list, ranked=False),
        steward=(lease.holder or None) if lease is not None else None,
        steward_epoch=lease.epoch if lease is not None else 0,
        exists=exists,
    )


def observe_run(
    backend: str, holder: _RendezvousStateHolder, board: RendezvousBoard
) -> RendezvousStatus:
    """The snapshot of ``holder``'s run as stored now; reads only, creates no key.

    A run with nothing stored reads as round 0 with no nodes, and ``exists`` false.
    """
    state = holder.observe()
    lease, liveness = board.observe()
    report = (
        LivenessReport({}) if liveness is None else decode_liveness(liveness, "the liveness key")
    )
    exists = state is not None or lease is not None
    return build_status(
        board.run_id, backend, state or RendezvousState(), lease, report, exists=exists
    )
