"""A completed round's per-node answers and its roster, byte for byte.

The steward publishes a completed round in three writes, in this order:

1. the roster (``roster/<round>``): the participants in rank order, the wait
   and redundancy lists; zlib-compressed JSON above 4 KiB. Read by whoever
   asks (``RendezvousInfo.participants``, ``status``), not by every node;
2. each participant's answer (``answer/<round>/<node>``): the round, its rank
   and the world size, and where the round's workers find their bootstrap
   store when the steward hosts it (``"bootstrap": {"addr": ..., "port":
   ...}``; absent when rank 0 publishes it at ``bootstrap/<round>``), a few
   dozen bytes, written in batches (``multi_set``);
3. the outcome (``result/<round>``, :func:`~.codecs.encode_outcome`): the
   round and its world size, which every waiting node is woken by.

So a node woken by the outcome reads only its own answer: what it receives
does not grow with the job (every node reading the whole participant list
was O(N) bytes per node, O(N^2) in all). A node without an answer was not
seated in that round. Other versions of this package and other backends (etcd)
read these documents: changing one is a change of the wire format.
"""

from __future__ import annotations

import functools
import json
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tp_rdzv_api import RendezvousStoreInfo
from tp_rdzv_dynamic.model.node_desc import _NodeDesc
from tp_rdzv_dynamic.model.state import RoundOutcome
from tp_rdzv_dynamic.quoting import quoted

from .bootstrap_address import bootstrap_fields, bootstrap_info
from .codecs import SCHEMA, _node_fields, _Reader

ANSWER_FORMAT = "tp-rdzv-answer"
ROSTER_FORMAT = "tp-rdzv-roster"
#: A roster longer than this is compressed (node names repeat a lot).
_COMPRESS_ABOVE = 4096


@dataclass(frozen=True)
class Seat:
    """One participant's answer: its rank in ``round`` of ``world_size`` nodes, and
    the workers' bootstrap store when the steward hosts it (``None``: rank 0
    publishes it)."""

    round: int
    rank: int
    world_size: int
    bootstrap: RendezvousStoreInfo | None = None


@dataclass(frozen=True)
class Roster:
    """The lists of a completed round: participants in rank order, wait and redundancy lists."""

    round: int
    participants: tuple[_NodeDesc, ...]
    wait_list: tuple[_NodeDesc, ...]
    redundancy_list: tuple[_NodeDesc, ...]


def encode_answer(seat: Seat) -> bytes:
    """The answer document of ``seat``."""
    return _encoder(seat.round, seat.world_size, seat.bootstrap)(seat.rank)


def _encoder(
    round_: int, world_size: int, bootstrap: RendezvousStoreInfo | None
) -> Callable[[int], bytes]:
    """The answers of one round by rank (formatted directly: the steward writes one
    per node, and all but the rank is the same for every node)."""
    head = f'{{"format":"{ANSWER_FORMAT}","schema":{SCHEMA},"round":{round_},"rank":'
    tail = f',"world_size":{world_size}'
    if bootstrap is not None:
        tail += f',"bootstrap":{{{bootstrap_fields(bootstrap)}}}'
    tail += "}"
    return lambda rank: f"{head}{rank}{tail}".encode()


def answers(
    outcome: RoundOutcome, bootstrap: RendezvousStoreInfo | None = None
) -> list[tuple[_NodeDesc, bytes]]:
    """Each participant of the completed ``outcome`` and its answer document, naming
    ``bootstrap`` when the steward hosts the workers' bootstrap store."""
    encode = _encoder(outcome.round, len(outcome.participants), bootstrap)
    return [(node, encode(rank)) for rank, node in enumerate(outcome.participants)]


def decode_answer(raw: bytes, where: str) -> Seat:
    """The seat in the answer ``raw``; ``RendezvousStateError`` naming ``where`` if malformed."""
    reader = _Reader(raw, ANSWER_FORMAT, where)
    fields = reader.document.get("bootstrap")
    if fields is not None and not isinstance(fields, dict):
        raise reader.error(f"has a bad 'bootstrap': expected an object, got {quoted(fields)}")
    seat = Seat(
        reader.value("round", int),
        reader.value("rank", int),
        reader.value("world_size", int),
        None if fields is None else bootstrap_info(reader, fields),
    )
    if seat.rank >= seat.world_size:
        raise reader.error(f"has rank {quoted(seat.rank)} in a world of {quoted(seat.world_size)}")
    return seat


def encode_roster(outcome: RoundOutcome) -> bytes:
    """The roster of the completed ``outcome``."""
    document: dict[str, Any] = {
        "format": ROSTER_FORMAT,
        "schema": SCHEMA,
        "round": outcome.round,
        "participants": [_node_fields(n) for n in outcome.participants],
        "wait_list": [_node_fields(n) for n in outcome.wait_list],
        "redundancy_list": [_node_fields(n) for n in outcome.redundancy_list],
    }
    raw = json.dumps(document, separators=(",", ":")).encode()
    return zlib.compress(raw) if len(raw) > _COMPRESS_ABOVE else raw


#: The nodes of one process that ask for the same roster decode it once: the
#: others wait for the first instead of all missing the cache together.
_decoding = threading.Lock()


def decode_roster(raw: bytes, where: str) -> Roster:
    """The roster in ``raw`` (decoded once per process); ``RendezvousStateError`` if malformed."""
    with _decoding:
        return _decode_roster(raw, where)


@functools.lru_cache(maxsize=4)
def _decode_roster(raw: bytes, where: str) -> Roster:
    reader = _Reader(raw, ROSTER_FORMAT, where)
    participants = tuple(node for node, _ in reader.nodes("participants"))
    if not participants:
        raise reader.error("has a complete round without participants")
    if len(set(participants)) != len(participants):
        raise reader.error("lists a participant twice")
    return Roster(
        reader.value("round", int),
        participants,
        tuple(node for node, _ in reader.nodes("wait_list")),
        tuple(node for node, _ in reader.nodes("redundancy_list")),
    )
