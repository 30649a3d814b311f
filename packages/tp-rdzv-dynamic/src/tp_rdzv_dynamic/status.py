"""What an observer sees of a run: the state, the steward, and heartbeat ages.

Heartbeats are counters, and wall clocks of other hosts are never trusted, so an
observer cannot tell from a counter alone when it last moved. The steward,
which samples every counter once per tick on its own monotonic clock, publishes
the ages it measured (:func:`encode_liveness`); :func:`build_status` joins them
with the state. Ages are as of the steward's last tick, at most one
``keep_alive_interval`` old.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tp_rdzv_api import RendezvousStateError

from .board import Lease
from .documents import DocumentError, load_document
from .node import _NodeDesc
from .state import RendezvousState

LIVENESS_FORMAT = "tp-rdzv-liveness"


@dataclass(frozen=True)
class NodeStatus:
    """One node as an observer sees it.

    Attributes:
        node: the node's name (``str()`` of its descriptor).
        rank: its rank in the completed round, else ``None``.
        heartbeat_age: seconds since its heartbeat last moved, as the steward
            measured at its last tick; ``None`` before the steward saw it.
    """

    node: str
    rank: int | None
    heartbeat_age: float | None


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


def encode_liveness(ages: Mapping[str, float]) -> bytes:
    """The steward's liveness report: seconds since each node's counter moved."""
    document = {
        "format": LIVENESS_FORMAT,
        "ages": {key: round(age, 3) for key, age in ages.items()},
    }
    return json.dumps(document, separators=(",", ":")).encode()


def decode_liveness(raw: bytes, where: str) -> dict[str, float]:
    """The ages in a liveness report; ``RendezvousStateError`` naming ``where`` if malformed."""
    try:
        document = load_document(raw)
    except DocumentError as exc:
        raise RendezvousStateError(f"the liveness report at {where} {exc}") from exc
    ages = document.get("ages") if isinstance(document, dict) else None
    if not isinstance(ages, dict) or document.get("format") != LIVENESS_FORMAT:
        raise RendezvousStateError(f"the liveness report at {where} is malformed: {raw[:200]!r}")
    seconds: dict[str, float] = {}
    for key, age in ages.items():
        value = _seconds(age)
        if value is None:
            raise RendezvousStateError(f"the liveness report at {where} has a bad age {age!r:.40}")
        seconds[str(key)] = value
    return seconds


def _seconds(age: object) -> float | None:
    """``age`` as a finite float, else ``None`` (an int may be too large for a float: 10**400)."""
    if not isinstance(age, int | float) or isinstance(age, bool):
        return None
    try:
        value = float(age)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def build_status(
    run_id: str,
    backend: str,
    state: RendezvousState,
    lease: Lease | None,
    ages: Mapping[str, float],
    *,
    exists: bool = True,
) -> RendezvousStatus:
    """Join the state, the lease and the steward's heartbeat ages into a snapshot."""

    def describe(nodes: Iterable[_NodeDesc], ranked: bool) -> tuple[NodeStatus, ...]:
        return tuple(
            NodeStatus(
                node.key,
                state.participants[node] if ranked else None,
                ages.get(node.key),
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
