"""PyTorch's c10d rendezvous state, decoded and encoded without PyTorch and without running code.

PyTorch's ``C10dRendezvousBackend`` keeps the state of run ``R`` in the store
key ``torch.rendezvous.R``: the base64 of ``pickle.dumps`` of its
``_RendezvousState`` (round, complete, deadline, closed, participants,
wait_list, redundancy_list, last_heartbeats; nodes are ``_NodeDesc``).

Reading never calls ``pickle.loads``: a restricted reader
(:mod:`.restricted_pickle`) resolves exactly PyTorch's two classes, to plain
records of ours, and the ``datetime`` types the state holds; every other
global is refused, so a store writer cannot make a reader run code, nor spend
more than a bounded time and memory. Writing emits the pickle opcodes of that one shape by hand,
naming PyTorch's classes without importing PyTorch, so PyTorch reads it back
as its own.
"""

from __future__ import annotations

import base64
import binascii
import pickle
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from tp_rdzv_api import RendezvousStateError
from tp_rdzv_dynamic.model.node_desc import node_from_fields
from tp_rdzv_dynamic.quoting import quoted

from .restricted_pickle import MAX_PICKLE_BYTES, Record, load_records

#: The module of PyTorch's rendezvous state classes (PyTorch 2.13).
TORCH_MODULE = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
#: What PyTorch's backend stores before any state: the base64 of b"canimadam".
TORCH_VACANT = b"Y2FuaW1hZGFt"
#: The attributes of PyTorch's ``_RendezvousState`` (older releases lack redundancy_list).
_STATE_FIELDS = frozenset(
    {
        "round",
        "complete",
        "deadline",
        "closed",
        "participants",
        "wait_list",
        "redundancy_list",
        "last_heartbeats",
    }
)
_NODE_FIELDS = ("addr", "pid", "local_id")


@dataclass(frozen=True, order=True)
class TorchNode:
    """A node of a PyTorch rendezvous (PyTorch's ``_NodeDesc``)."""

    addr: str
    pid: int
    local_id: int

    def __str__(self) -> str:
        return f"{self.addr}_{self.pid}_{self.local_id}"


@dataclass
class TorchRendezvousState:
    """PyTorch's ``_RendezvousState``, as plain data."""

    round: int = 0
    complete: bool = False
    deadline: datetime | None = None
    closed: bool = False
    participants: dict[TorchNode, int] = field(default_factory=dict)
    wait_list: set[TorchNode] = field(default_factory=set)
    redundancy_list: set[TorchNode] = field(default_factory=set)
    last_heartbeats: dict[TorchNode, datetime] = field(default_factory=dict)


# -- reading ---------------------------------------------------------------------------


class _StateRecord(Record):
    """PyTorch's ``_RendezvousState`` as read: its attribute dict, checked by :func:`_state`."""

    def __init__(self) -> None:
        self.fields: dict[Any, Any] = {}

    def __setstate__(self, state: object) -> None:
        if not isinstance(state, dict):
            raise pickle.UnpicklingError("the _RendezvousState's state is not a dict")
        self.fields = state


class _NodeRecord(Record):
    """PyTorch's ``_NodeDesc`` as read: checked when given its attributes, before
    anything hashes it (nodes are dict keys and set members)."""

    def __init__(self) -> None:
        self.node: TorchNode | None = None

    def __setstate__(self, state: object) -> None:
        if not isinstance(state, dict) or state.keys() != set(_NODE_FIELDS):
            raise pickle.UnpicklingError(f"a _NodeDesc's state is not a dict of {_NODE_FIELDS}")
        try:
            node = node_from_fields(state["addr"], state["pid"], state["local_id"])
        except ValueError as exc:
            raise pickle.UnpicklingError(f"a malformed _NodeDesc: {exc}") from exc
        self.node = TorchNode(node.addr, node.pid, node.local_id)

    def __hash__(self) -> int:
        return hash(self.node)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _NodeRecord) and self.node == other.node


_RECORDS: dict[tuple[str, str], type[Record]] = {
    (TORCH_MODULE, "_RendezvousState"): _StateRecord,
    (TORCH_MODULE, "_NodeDesc"): _NodeRecord,
}
#: The datetime types a state holds (deadline, heartbeats); they build plain values only.
_CONSTRUCTORS: dict[tuple[str, str], type] = {
    ("datetime", kind.__name__): kind for kind in (datetime, timezone, timedelta)
}
#: The longest value read: the base64 of the largest pickle read.
MAX_STATE_BYTES = 4 * -(-MAX_PICKLE_BYTES // 3)


def decode_torch_state(value: bytes, where: str) -> TorchRendezvousState:
    """The state in ``value`` (base64 of PyTorch's pickle), checked field by field.

    Reading is bounded (:mod:`.restricted_pickle`): whatever ``value`` holds,
    it takes well under a second and tens of MiB at most.

    Raises:
        RendezvousStateError: naming ``where``, when ``value`` is not a state
            PyTorch's c10d backend wrote, or is longer than :data:`MAX_STATE_BYTES`.
    """
    if len(value) > MAX_STATE_BYTES:
        raise RendezvousStateError(
            f"{where} holds {len(value)} bytes, more than the {MAX_STATE_BYTES} "
            "of the largest PyTorch state read"
        )
    try:
        pickled = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RendezvousStateError(f"{where} is not base64 ({exc})") from exc
    try:
        record = load_records(pickled, _RECORDS, _CONSTRUCTORS)
    except pickle.UnpicklingError as exc:
        raise RendezvousStateError(
            f"{where} is not a PyTorch c10d rendezvous state: {exc}"
        ) from exc
    try:
        return _state(record)
    except (TypeError, ValueError) as exc:
        raise RendezvousStateError(f"{where} holds a malformed PyTorch state: {exc}") from exc


def _state(record: object) -> TorchRendezvousState:
    if not isinstance(record, _StateRecord):
        raise TypeError(f"the pickle holds a {type(record).__name__}, not a _RendezvousState")
    fields = record.fields
    unknown = [name for name in fields if name not in _STATE_FIELDS]
    missing = _STATE_FIELDS - {"redundancy_list"} - fields.keys()
    if unknown or missing:
        raise ValueError(f"unknown attributes {quoted(unknown)}, missing {sorted(missing)}")
    deadline = fields["deadline"]
    if deadline is not None and not isinstance(deadline, datetime):
        raise TypeError(f"deadline is a {type(deadline).__name__}")
    participants = _mapping(fields["participants"], "participants", int)
    heartbeats = _mapping(fields["last_heartbeats"], "last_heartbeats", datetime)
    return TorchRendezvousState(
        round=_check(fields["round"], int, "round"),
        complete=_check(fields["complete"], bool, "complete"),
        deadline=deadline,
        closed=_check(fields["closed"], bool, "closed"),
        participants=participants,
        wait_list=_nodes(fields["wait_list"], "wait_list"),
        redundancy_list=_nodes(fields.get("redundancy_list", set()), "redundancy_list"),
        last_heartbeats=heartbeats,
    )


def _check(value: object, kind: type, what: str) -> Any:
    # bool is an int: a round must not be True, a flag must not be 1.
    if type(value) is not kind:
        raise TypeError(f"{what} is a {type(value).__name__}, not {kind.__name__}")
    return value


def _node(value: object, what: str) -> TorchNode:
    if not isinstance(value, _NodeRecord):
        raise TypeError(f"{what} holds a {type(value).__name__}, not a _NodeDesc")
    if value.node is None:
        raise ValueError(f"{what} holds a _NodeDesc without attributes")
    return value.node


def _nodes(value: object, what: str) -> set[TorchNode]:
    if not isinstance(value, set):
        raise TypeError(f"{what} is a {type(value).__name__}, not a set")
    return {_node(item, what) for item in value}


def _mapping(value: object, what: str, kind: type) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{what} is a {type(value).__name__}, not a dict")
    return {_node(node, what): _check(item, kind, what) for node, item in value.items()}


# -- writing ---------------------------------------------------------------------------


def encode_torch_state(state: TorchRendezvousState) -> bytes:
    """``state`` as PyTorch's backend stores it: base64 of a pickle PyTorch loads as its own."""
    writer = _PickleWriter()
    writer.record(
        "_RendezvousState",
        {
            "round": state.round,
            "complete": state.complete,
            "deadline": state.deadline,
            "closed": state.closed,
            "participants": dict(sorted(state.participants.items())),
            "wait_list": sorted(state.wait_list),
            "redundancy_list": sorted(state.redundancy_list),
            "last_heartbeats": dict(sorted(state.last_heartbeats.items())),
        },
        sets={"wait_list", "redundancy_list"},
    )
    return base64.b64encode(writer.finish())


class _PickleWriter:
    """Pickle protocol 4 opcodes for the values of a state (no memo: nothing is shared)."""

    def __init__(self) -> None:
        self._out = bytearray(pickle.PROTO + bytes([4]))

    def finish(self) -> bytes:
        return bytes(self._out + pickle.STOP)

    def _global(self, module: str, name: str) -> None:
        self.value(module)
        self.value(name)
        self._out += pickle.STACK_GLOBAL

    def record(self, name: str, fields: Mapping[str, Any], sets: frozenset[str] | set[str]) -> None:
        """An instance of PyTorch's class ``name`` with attribute dict ``fields``."""
        self._global(TORCH_MODULE, name)
        self._out += pickle.EMPTY_TUPLE + pickle.NEWOBJ + pickle.EMPTY_DICT + pickle.MARK
        for key, item in fields.items():
            self.value(key)
            if key in sets:
                self._set(item)
            else:
                self.value(item)
        self._out += pickle.SETITEMS + pickle.BUILD

    def _set(self, items: list[TorchNode]) -> None:
        self._out += pickle.EMPTY_SET
        if items:
            self._out += pickle.MARK
            for item in items:
                self.value(item)
            self._out += pickle.ADDITEMS

    def value(self, value: object) -> None:
        out = self._out
        if value is None:
            out += pickle.NONE
        elif isinstance(value, bool):
            out += pickle.NEWTRUE if value else pickle.NEWFALSE
        elif isinstance(value, int):
            if not -(2**31) <= value < 2**31:
                raise ValueError(f"cannot encode the integer {value} in a rendezvous state")
            out += pickle.BININT + struct.pack("<i", value)
        elif isinstance(value, str):
            data = value.encode("utf-8", "surrogatepass")
            out += pickle.BINUNICODE + struct.pack("<I", len(data)) + data
        elif isinstance(value, bytes):
            out += pickle.BINBYTES + struct.pack("<I", len(value)) + value
        elif isinstance(value, tuple):
            out += pickle.MARK
            for item in value:
                self.value(item)
            out += pickle.TUPLE
        elif isinstance(value, dict):
            out += pickle.EMPTY_DICT
            if value:
                out += pickle.MARK
                for key, item in value.items():
                    self.value(key)
                    self.value(item)
                out += pickle.SETITEMS
        elif isinstance(value, TorchNode):
            fields = {"addr": value.addr, "pid": value.pid, "local_id": value.local_id}
            self.record("_NodeDesc", fields, sets=frozenset())
        elif isinstance(value, (datetime, timezone, timedelta)):
            # Their own reduction: the class and the arguments that rebuild it.
            reduced = value.__reduce__()
            assert isinstance(reduced, tuple)
            kind, args = reduced[:2]
            self._global("datetime", kind.__name__)
            self.value(args)
            out += pickle.REDUCE
        else:
            raise TypeError(f"cannot encode a {type(value).__name__} in a rendezvous state")
