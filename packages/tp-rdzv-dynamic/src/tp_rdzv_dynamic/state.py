"""The rendezvous state and the round outcome, as versioned JSON documents.

Nothing read from a store is ever unpickled: a writable store must not mean code
execution on every node. Decoding is strict; anything unexpected raises
:class:`~tp_rdzv_api.RendezvousStateError` naming where the document came from.
"""

from __future__ import annotations

import functools
import json
import threading
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tp_rdzv_api import RendezvousStateError

from .documents import DocumentError, load_document
from .node import _NodeDesc, node_from_fields

STATE_FORMAT = "tp-rdzv-state"
_COMPRESS_ABOVE = 4096
OUTCOME_FORMAT = "tp-rdzv-round"
SCHEMA = 1


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


@dataclass(frozen=True)
class RoundOutcome:
    """How a round ended, as published to every node.

    Attributes:
        round: the round.
        closed: the rendezvous closed instead of completing this round.
        participants: the nodes in rank order (empty when closed).
        wait_list: the nodes waiting for the next round when it completed.
        redundancy_list: the nodes beyond ``max_nodes`` when it completed.
        ranks: each participant's rank.
        error: why the steward could not decide this round (the state is
            corrupt), or ``None``.
    """

    round: int
    closed: bool
    participants: tuple[_NodeDesc, ...] = ()
    wait_list: tuple[_NodeDesc, ...] = ()
    redundancy_list: frozenset[_NodeDesc] = frozenset()
    ranks: dict[_NodeDesc, int] = field(default_factory=dict, compare=False)
    error: str | None = None


def _node_fields(node: _NodeDesc) -> list[Any]:
    return [node.addr, node.pid, node.local_id]


def encode_state(state: RendezvousState) -> bytes:
    """The state as a JSON document."""
    document = {
        "format": STATE_FORMAT,
        "schema": SCHEMA,
        "round": state.round,
        "complete": state.complete,
        "closed": state.closed,
        "epoch": state.epoch,
        "participants": [[*_node_fields(n), rank] for n, rank in state.participants.items()],
        "wait_list": [_node_fields(n) for n in state.wait_list],
        "redundancy_list": [_node_fields(n) for n in state.redundancy_list],
        "hints": [[*_node_fields(n), hint] for n, hint in state.hints.items()],
        "last_order": [_node_fields(n) for n in state.last_order],
    }
    return json.dumps(document, separators=(",", ":")).encode()


def encode_outcome(state: RendezvousState) -> bytes:
    """The outcome of the state's completed round, as published to the nodes.

    Every node reads it, so a large one is zlib-compressed JSON (node names
    repeat a lot): a few KiB per node instead of ~30 bytes per participant.
    """
    document = {
        "format": OUTCOME_FORMAT,
        "schema": SCHEMA,
        "round": state.round,
        "status": "complete",
        "participants": [_node_fields(n) for n in state.in_rank_order()],
        "wait_list": [_node_fields(n) for n in state.wait_list],
        "redundancy_list": [_node_fields(n) for n in state.redundancy_list],
    }
    raw = json.dumps(document, separators=(",", ":")).encode()
    return zlib.compress(raw) if len(raw) > _COMPRESS_ABOVE else raw


def encode_closed_outcome(round_: int) -> bytes:
    """The outcome of a round that the closing of the rendezvous ended."""
    document = {"format": OUTCOME_FORMAT, "schema": SCHEMA, "round": round_, "status": "closed"}
    return json.dumps(document, separators=(",", ":")).encode()


def encode_failed_outcome(round_: int, error: str) -> bytes:
    """The outcome of a round the steward could not decide, and why."""
    document = {
        "format": OUTCOME_FORMAT,
        "schema": SCHEMA,
        "round": round_,
        "status": "error",
        "error": error,
    }
    return json.dumps(document, separators=(",", ":")).encode()


class _Reader:
    """Strict field access that names the document and the field on every error."""

    def __init__(self, raw: bytes, expected_format: str, where: str) -> None:
        self.where = where
        try:
            document = load_document(raw)
        except DocumentError as exc:
            raise self.error(str(exc)) from exc
        if not isinstance(document, dict):
            raise self.error(f"is not a JSON object but {type(document).__name__}")
        self.document: dict[str, Any] = document
        if document.get("format") != expected_format:
            raise self.error(f"has format {document.get('format')!r}, expected {expected_format!r}")
        if document.get("schema") != SCHEMA:
            raise self.error(
                f"has schema version {document.get('schema')!r}; this version reads {SCHEMA}"
            )

    def error(self, problem: str) -> RendezvousStateError:
        return RendezvousStateError(f"the rendezvous document at {self.where} {problem}")

    def value(self, name: str, kind: type) -> Any:
        value = self.document.get(name)
        if kind is int:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise self.error(f"has a bad {name!r}: expected an int >= 0, got {value!r}")
        elif not isinstance(value, kind):
            raise self.error(f"has a bad {name!r}: expected {kind.__name__}, got {value!r}")
        return value

    def nodes(self, name: str, extra: bool = False) -> list[tuple[_NodeDesc, int]]:
        """The node list ``name``; with ``extra`` each entry carries one more int."""
        entries = self.value(name, list)
        width = 4 if extra else 3
        result = []
        for index, entry in enumerate(entries):
            try:
                if not isinstance(entry, list) or len(entry) != width:
                    raise ValueError(f"expected {width} fields")
                node = node_from_fields(entry[0], entry[1], entry[2])
                if extra and (type(entry[3]) is not int or entry[3] < 0):
                    raise ValueError(f"expected an int >= 0 after the node, got {entry[3]!r}")
            except ValueError as exc:
                raise self.error(f"has a bad entry {name}[{index}]: {exc}") from exc
            result.append((node, entry[3] if extra else 0))
        return result


def decode_state(raw: bytes, where: str) -> RendezvousState:
    """The state in ``raw``; ``where`` names its store key in error messages."""
    reader = _Reader(raw, STATE_FORMAT, where)
    state = RendezvousState(
        round=reader.value("round", int),
        complete=reader.value("complete", bool),
        closed=reader.value("closed", bool),
        participants=dict(reader.nodes("participants", extra=True)),
        wait_list=dict.fromkeys(node for node, _ in reader.nodes("wait_list")),
        redundancy_list=dict.fromkeys(node for node, _ in reader.nodes("redundancy_list")),
        hints=dict(reader.nodes("hints", extra=True)),
        last_order=[node for node, _ in reader.nodes("last_order")],
        epoch=reader.value("epoch", int),
    )
    # Each node is in one list at most: the steward samples each member once.
    listed = len(state.participants) + len(state.wait_list) + len(state.redundancy_list)
    if len(set(state.members())) != listed:
        raise reader.error(
            "lists a node in more than one of participants, wait_list, redundancy_list"
        )
    # Participants keep their ranks when others leave a completed round, so
    # the ranks may have gaps; each must still be the node's place in the
    # order the round completed with.
    order = state.last_order
    if state.complete and any(
        rank >= len(order) or order[rank] != node for node, rank in state.participants.items()
    ):
        raise reader.error("has a complete round whose ranks are not its places in last_order")
    return state


#: Nodes of one process woken by the same outcome decode it once: the others
#: wait for the first instead of all missing the cache together.
_decoding = threading.Lock()


def decode_outcome(raw: bytes, where: str) -> RoundOutcome:
    """The round outcome in ``raw`` (decoded once per process: every node reads the same bytes)."""
    with _decoding:
        return _decode_outcome(raw, where)


@functools.lru_cache(maxsize=8)
def _decode_outcome(raw: bytes, where: str) -> RoundOutcome:
    reader = _Reader(raw, OUTCOME_FORMAT, where)
    round_ = reader.value("round", int)
    status = reader.document.get("status")
    if status == "closed":
        return RoundOutcome(round_, closed=True)
    if status == "error":
        return RoundOutcome(round_, closed=False, error=str(reader.value("error", str)))
    if status != "complete":
        raise reader.error(f"has an unknown status {status!r}")
    participants = tuple(node for node, _ in reader.nodes("participants"))
    if not participants:
        raise reader.error("has a complete round without participants")
    ranks = {node: rank for rank, node in enumerate(participants)}
    if len(ranks) != len(participants):
        raise reader.error("lists a participant twice")
    return RoundOutcome(
        round_,
        closed=False,
        participants=participants,
        wait_list=tuple(node for node, _ in reader.nodes("wait_list")),
        redundancy_list=frozenset(node for node, _ in reader.nodes("redundancy_list")),
        ranks=ranks,
    )
