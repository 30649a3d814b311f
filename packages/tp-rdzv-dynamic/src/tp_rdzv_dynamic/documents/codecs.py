"""Every document of a run, byte for byte: how each is written and strictly read.

The state (the backend's document), the round outcome (``result/<round>``),
the mailbox message, the steward lease and the steward's liveness report.
Nothing read from a store is ever unpickled: a writable store must not mean
code execution on every node. Every document is read within bounds
(:mod:`.bounded_json`); anything unexpected in the state, an outcome or a
liveness report raises :class:`~tp_rdzv_api.RendezvousStateError` naming where
it came from, while a bad message is a ``ValueError`` (the steward drops it)
and a bad lease reads as vacant. Other versions of this package and the CLI
read these documents: changing one is a change of the wire format.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tp_rdzv_api import RendezvousStateError
from tp_rdzv_dynamic.model.decisions import Join, Leave, Message
from tp_rdzv_dynamic.model.gone import MAX_TOKEN_LENGTH, Gone
from tp_rdzv_dynamic.model.node_desc import _NodeDesc, node_from_fields
from tp_rdzv_dynamic.model.state import RendezvousState, RoundOutcome
from tp_rdzv_dynamic.quoting import quoted

from .bounded_json import MAX_MESSAGE_BYTES, DocumentError, load_document
from .layout import MAX_RECEIPT_LENGTH, RECEIPT_PREFIX

STATE_FORMAT = "tp-rdzv-state"
OUTCOME_FORMAT = "tp-rdzv-round"
SCHEMA = 1
LIVENESS_FORMAT = "tp-rdzv-liveness"
#: What wakes a steward blocked on the mailbox (it ignores the message).
WAKE_MESSAGE = b'{"op":"wake"}'
#: The longest error message of a failed round's outcome read (longer ones are cut).
MAX_ERROR_LENGTH = 2000
#: The beat of a lease held through its holder's store session: the store
#: deletes the lease when that session ends, so nobody judges it by silence.
SESSION_BEAT = "*"
#: What the mailbox carries: a node's message, or the store's word that a node is gone.
Mail = Message | Gone


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


def encode_outcome(outcome: RoundOutcome) -> bytes:
    """``outcome`` as published to the nodes: complete, closed, or why nobody could decide it.

    Every node waits for it, so a complete one carries only the world size (a
    few dozen bytes): each node then reads its own answer, and whoever wants
    the lists reads the roster (:mod:`.answers`).
    """
    document: dict[str, Any] = {"format": OUTCOME_FORMAT, "schema": SCHEMA, "round": outcome.round}
    if outcome.closed:
        document["status"] = "closed"
    elif outcome.error is not None:
        document.update(status="error", error=outcome.error)
    else:
        document.update(status="complete", world_size=outcome.world_size)
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
            raise self.error(
                f"has format {quoted(document.get('format'))}, expected {expected_format!r}"
            )
        if document.get("schema") != SCHEMA:
            raise self.error(
                f"has schema version {quoted(document.get('schema'))}; this version reads {SCHEMA}"
            )

    def error(self, problem: str) -> RendezvousStateError:
        return RendezvousStateError(f"the rendezvous document at {self.where} {problem}")

    def value(self, name: str, kind: type) -> Any:
        value = self.document.get(name)
        if kind is int:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise self.error(f"has a bad {name!r}: expected an int >= 0, got {quoted(value)}")
        elif not isinstance(value, kind):
            raise self.error(f"has a bad {name!r}: expected {kind.__name__}, got {quoted(value)}")
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
                    raise ValueError(f"expected an int >= 0 after the node, got {quoted(entry[3])}")
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


def decode_outcome(raw: bytes, where: str) -> RoundOutcome:
    """The round outcome in ``raw``: closed, an error, or complete with its world size."""
    reader = _Reader(raw, OUTCOME_FORMAT, where)
    round_ = reader.value("round", int)
    status = reader.document.get("status")
    if status == "closed":
        return RoundOutcome(round_, closed=True)
    if status == "error":
        # Raised as each waiting node's error: what a steward writes is short.
        error: str = reader.value("error", str)
        cut = error if len(error) <= MAX_ERROR_LENGTH else error[:MAX_ERROR_LENGTH] + "..."
        return RoundOutcome(round_, closed=False, error=cut)
    if status != "complete":
        raise reader.error(f"has an unknown status {quoted(status)}")
    world_size = reader.value("world_size", int)
    if world_size < 1:
        raise reader.error("has a complete round without participants")
    return RoundOutcome(round_, closed=False, world_size=world_size)


@dataclass(frozen=True)
class Lease:
    """The steward lease as read from the store.

    Who holds it, at which epoch, its heartbeat, and the round a joining node
    should wait for: one read tells a joiner both whom to trust and where to
    wait.
    """

    raw: bytes
    epoch: int
    holder: str  # a node key, or "" when vacant
    round: int = 0
    #: Held through the holder's store session: vacant (deleted) the moment it ends.
    session_held: bool = False

    @classmethod
    def parse(cls, raw: bytes) -> Lease:
        """The lease in ``raw``; anything unreadable counts as vacant at epoch 0, round 0.

        So does a lease longer than :data:`~.bounded_json.MAX_MESSAGE_BYTES`
        (no steward writes one): what a store writer put there costs no more
        to read than a real lease.
        """
        if len(raw) > MAX_MESSAGE_BYTES:
            return cls(raw, 0, "")
        parts = raw.split(b" ")
        if len(parts) != 4:
            return cls(raw, 0, "")
        try:
            epoch, round_ = int(parts[0]), int(parts[3])
            holder = "" if parts[1] == b"-" else parts[1].decode()
        except (ValueError, UnicodeDecodeError):
            return cls(raw, 0, "")
        if not holder.isprintable():  # a node key is printable: this one is no steward's
            return cls(raw, 0, "")
        session_held = bool(holder) and parts[2] == SESSION_BEAT.encode()
        return cls(raw, max(epoch, 0), holder, max(round_, 0), session_held)

    @staticmethod
    def encode(epoch: int, holder: str, beat: int | str, round_: int) -> bytes:
        """The lease of ``holder`` (``""``: vacant) at heartbeat ``beat``, hinting ``round_``.

        ``beat`` is :data:`SESSION_BEAT` for a lease held through a store session.
        """
        return f"{epoch} {holder or '-'} {beat} {round_}".encode()


def encode_message(event: Mail, receipt: str | None = None) -> bytes:
    """A mailbox message carrying ``event`` (a :class:`Gone` is a presence session's will)."""
    node = event.node
    op = "join" if isinstance(event, Join) else "gone" if isinstance(event, Gone) else "leave"
    document: dict[str, object] = {"op": op, "node": [node.addr, node.pid, node.local_id]}
    if isinstance(event, Gone):
        document["token"] = event.token
    if isinstance(event, Join):
        document["round"] = event.round
        if event.hint is not None:
            document["hint"] = event.hint
    if receipt is not None:
        document["receipt"] = receipt
    return json.dumps(document, separators=(",", ":")).encode()


def decode_message(raw: bytes) -> tuple[Mail | None, str | None]:
    """The event (``None`` for a wake-up) and receipt in a mailbox message.

    Raises ``ValueError`` if the message is malformed, longer than
    :data:`~.bounded_json.MAX_MESSAGE_BYTES` or nested too deeply.
    """
    document = load_document(raw, MAX_MESSAGE_BYTES)
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    if document.get("op") == "wake":
        return None, None
    fields = document.get("node")
    if not isinstance(fields, list) or len(fields) != 3:
        raise ValueError(f"bad node {quoted(fields)}: expected [address, pid, local id]")
    try:
        node = node_from_fields(*fields)
    except ValueError as exc:
        raise ValueError(f"bad node: {exc}") from exc
    receipt = document.get("receipt")
    if receipt is not None and not (
        isinstance(receipt, str)
        and receipt.startswith(RECEIPT_PREFIX)
        and len(receipt) <= MAX_RECEIPT_LENGTH
        and receipt.isprintable()  # a key: a lone surrogate cannot be encoded
    ):
        raise ValueError(
            f"bad receipt {quoted(receipt)}: expected {RECEIPT_PREFIX!r} and at most "
            f"{MAX_RECEIPT_LENGTH} printable characters"
        )
    op = document.get("op")
    if op == "leave":
        return Leave(node), receipt
    if op == "gone":
        token = document.get("token")
        if not (
            isinstance(token, str) and 0 < len(token) <= MAX_TOKEN_LENGTH and token.isprintable()
        ):
            raise ValueError(f"bad token {quoted(token)}")
        return Gone(node, token), receipt
    if op != "join":
        raise ValueError(f"unknown op {quoted(op)}")
    hint = document.get("hint")
    if hint is not None and (type(hint) is not int or hint < 0):
        raise ValueError(f"bad hint {quoted(hint)}")
    round_ = document.get("round")
    if type(round_) is not int or round_ < 0:
        raise ValueError(f"bad round {quoted(round_)}")
    return Join(node, hint, round_), receipt


@dataclass(frozen=True)
class LivenessReport:
    """What the steward knows of the members' liveness.

    ``present``: the nodes it watches through their presence sessions (the
    store tells it when one ends); ``ages``: for the others (stores without
    sessions), seconds since each one's heartbeat counter last moved.
    """

    ages: Mapping[str, float]
    present: frozenset[str] = frozenset()


def encode_liveness(report: LivenessReport) -> bytes:
    """The steward's liveness report."""
    document: dict[str, object] = {
        "format": LIVENESS_FORMAT,
        "ages": {key: round(age, 3) for key, age in report.ages.items()},
    }
    if report.present:
        document["present"] = sorted(report.present)
    return json.dumps(document, separators=(",", ":")).encode()


def decode_liveness(raw: bytes, where: str) -> LivenessReport:
    """A liveness report; ``RendezvousStateError`` naming ``where`` if malformed."""
    try:
        document = load_document(raw)
    except DocumentError as exc:
        raise RendezvousStateError(f"the liveness report at {where} {exc}") from exc
    ages = document.get("ages") if isinstance(document, dict) else None
    present = document.get("present", []) if isinstance(document, dict) else None
    if (
        not isinstance(ages, dict)
        or not isinstance(present, list)
        or document.get("format") != LIVENESS_FORMAT
    ):
        raise RendezvousStateError(f"the liveness report at {where} is malformed: {quoted(raw)}")
    seconds: dict[str, float] = {}
    for key, age in ages.items():
        value = _seconds(age)
        if value is None:
            raise RendezvousStateError(
                f"the liveness report at {where} has a bad age {quoted(age)}"
            )
        seconds[str(key)] = value
    return LivenessReport(seconds, frozenset(str(key) for key in present))


def _seconds(age: object) -> float | None:
    """``age`` as a finite float, else ``None`` (an int may be too large for a float: 10**400)."""
    if not isinstance(age, int | float) or isinstance(age, bool):
        return None
    try:
        value = float(age)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None
