"""Hostile store values for every decoder of store data: hypothesis strategies and bombs.

Two kinds of values: structured ones (a real document or PyTorch state with
parts replaced by deep, wide or wrongly typed values, surrogates, control
characters, huge numbers, NaN) that get past the first checks, and raw bytes.
``TP_HOSTILE_EXAMPLES`` sets how many examples each property runs (the short
profile in the default test command, thousands in ``nox -s hostile``).
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import zlib
from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import strategies as st

from tp_rdzv_api import RendezvousStoreInfo
from tp_rdzv_dynamic import _NodeDesc
from tp_rdzv_dynamic.documents.answers import Seat, encode_answer, encode_roster
from tp_rdzv_dynamic.documents.bootstrap_address import encode_bootstrap_address
from tp_rdzv_dynamic.documents.codecs import (
    Lease,
    LivenessReport,
    encode_liveness,
    encode_message,
    encode_outcome,
    encode_state,
)
from tp_rdzv_dynamic.model.decisions import Join, Leave
from tp_rdzv_dynamic.model.gone import Gone
from tp_rdzv_dynamic.model.state import RendezvousState, RoundOutcome
from tp_rdzv_dynamic.testing import shared_tuple_tree, torch_state_around
from tp_rdzv_dynamic.torch_compat.torch_state import (
    TorchNode,
    TorchRendezvousState,
    encode_torch_state,
)

#: Examples per property (the default test command's short profile).
EXAMPLES = int(os.environ.get("TP_HOSTILE_EXAMPLES", "80"))

NODES = [_NodeDesc(f"node{index}", 100 + index, 0) for index in range(4)]

# -- hostile JSON values -----------------------------------------------------------------

#: Characters that break keys, logs and terminals: lone surrogates, controls, format marks.
_HOSTILE_CHARACTERS = st.characters(categories=["Cs", "Cc", "Cf", "Zs", "Nd", "No", "Lu", "So"])
_TEXT = st.one_of(
    st.text(_HOSTILE_CHARACTERS, max_size=20),
    st.sampled_from(["", "\ud800", "evil\udc80", "a\nb", "[/]x", "rcpt/\ud800", "node0"]),
    # Wide: up to 1 MiB in one string.
    st.integers(0, 1 << 20).map(lambda size: "x" * size),
)
_NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.integers(-(10**300), 10**300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 2**63, 2**64, True, False]),
)
_LEAVES = st.one_of(st.none(), st.booleans(), _NUMBERS, _TEXT)
_SMALL_LEAVES = st.one_of(st.none(), _NUMBERS, st.text(_HOSTILE_CHARACTERS, max_size=8))
HOSTILE_JSON = st.recursive(
    _LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.dictionaries(st.text(_HOSTILE_CHARACTERS, max_size=8), children, max_size=6),
        # Wide: one small value repeated many times (at the leaves only: no blow-up).
        st.tuples(_SMALL_LEAVES, st.integers(0, 50_000)).map(lambda pair: [pair[0]] * pair[1]),
    ),
    max_leaves=12,
)
#: Byte strings no steward writes: deep, unpaired, huge, not UTF-8, not JSON.
_RAW_TEXTS = st.one_of(
    st.integers(1, 200_000).map(lambda depth: b"[" * depth + b"]" * depth),
    st.integers(1, 200_000).map(lambda depth: b'{"a":' * depth),
    st.sampled_from([b"", b"x", b"NaN", b"\xff\xfe", b'"\\ud800"', b"9" * 5000, b"{}"]),
)
RAW_BYTES = st.one_of(st.binary(max_size=4096), _RAW_TEXTS)


@st.composite
def mutated(draw: st.DrawFn, bases: list[bytes]) -> bytes:
    """One of ``bases`` (JSON documents) with parts replaced, dropped or added, or spliced."""
    base = draw(st.sampled_from(bases))
    document = json.loads(zlib.decompress(base) if base[:1] == b"x" else base)
    for _ in range(draw(st.integers(0, 3))):
        places = _places(document)
        container, key = draw(st.sampled_from(places))
        action = draw(st.sampled_from(["replace", "replace", "drop", "add"]))
        if action == "replace" or (action == "drop" and isinstance(container, list)):
            container[key] = draw(HOSTILE_JSON)
        elif action == "drop":
            del container[key]
        elif isinstance(container, dict):
            container[draw(st.text(max_size=8))] = draw(HOSTILE_JSON)
        else:
            container.append(draw(HOSTILE_JSON))
    raw = json.dumps(document, allow_nan=True).encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        # Splice raw bytes in: numbers too long for int(), broken escapes, truncation.
        at = draw(st.integers(0, len(raw)))
        raw = (
            raw[:at] + draw(RAW_BYTES | st.just(b"9" * 5000)) + raw[at + draw(st.integers(0, 8)) :]
        )
    return zlib.compress(raw) if draw(st.integers(0, 4)) == 0 else raw


def _places(document: Any) -> list[tuple[Any, Any]]:
    """Every (container, key or index) in ``document``, the document itself as ``[doc][0]``."""
    places: list[tuple[Any, Any]] = [([document], 0)]
    pending = [document]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            keys: list[Any] = list(value)
        else:
            keys = list(range(len(value))) if isinstance(value, list) else []
        for key in keys:
            places.append((value, key))
            pending.append(value[key])
    return places


_COMPLETE = RendezvousState(
    round=3,
    complete=True,
    participants={NODES[0]: 0, NODES[1]: 1},
    wait_list={NODES[2]: None},
    redundancy_list={NODES[3]: None},
    hints={NODES[0]: 0},
    last_order=[NODES[0], NODES[1]],
    epoch=2,
)
STATES = [encode_state(RendezvousState()), encode_state(_COMPLETE)]
_LARGE = RoundOutcome(
    4, closed=False, participants=tuple(_NodeDesc(f"n{i}", i, 0) for i in range(300))
)
OUTCOMES = [
    encode_outcome(_COMPLETE.outcome()),
    encode_outcome(RoundOutcome(2, closed=True)),
    encode_outcome(RoundOutcome(2, closed=False, error="nobody decides")),
]
ANSWERS = [encode_answer(Seat(3, 1, 2))]
ROSTERS = [encode_roster(_COMPLETE.outcome()), encode_roster(_LARGE)]  # the large one compressed
BOOTSTRAPS = [encode_bootstrap_address(RendezvousStoreInfo("node0.example", 29500))]
MESSAGES = [
    encode_message(Join(NODES[0], 1, 0), "rcpt/abc"),
    encode_message(Leave(NODES[1])),
    encode_message(Gone(NODES[2], "ab" * 16)),
]
LIVENESS = [encode_liveness(LivenessReport({"node0_100_0": 1.5}, frozenset({"node1_101_0"})))]
LEASES = [Lease.encode(5, "node0_100_0", "*", 2), Lease.encode(1, "", 7, 0)]

DOCUMENT_STATES = mutated(STATES) | RAW_BYTES
DOCUMENT_OUTCOMES = mutated(OUTCOMES) | RAW_BYTES
DOCUMENT_ANSWERS = mutated(ANSWERS) | RAW_BYTES
DOCUMENT_ROSTERS = mutated(ROSTERS) | RAW_BYTES
DOCUMENT_BOOTSTRAPS = mutated(BOOTSTRAPS) | RAW_BYTES
DOCUMENT_MESSAGES = mutated(MESSAGES) | RAW_BYTES
DOCUMENT_LIVENESS = mutated(LIVENESS) | RAW_BYTES


@st.composite
def hostile_leases(draw: st.DrawFn) -> bytes:
    """A lease with one of its four fields replaced, or raw bytes."""
    fields = draw(st.sampled_from(LEASES)).split(b" ")
    index = draw(st.integers(0, len(fields) - 1))
    fields[index] = draw(RAW_BYTES | _TEXT.map(lambda text: text.encode("utf-8", "surrogatepass")))
    return b" ".join(fields)


LEASE_VALUES = hostile_leases() | RAW_BYTES

# -- hostile PyTorch states ----------------------------------------------------------------

_TORCH_NODES = [TorchNode(f"host{index}", 10 + index, 0) for index in range(3)]
_NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
TORCH_STATE = TorchRendezvousState(
    round=2,
    complete=True,
    deadline=_NOW + timedelta(seconds=30),
    participants={_TORCH_NODES[0]: 0, _TORCH_NODES[1]: 1},
    wait_list={_TORCH_NODES[2]},
    last_heartbeats=dict.fromkeys(_TORCH_NODES, _NOW),
)
#: The opcodes a hostile pickle is spliced from: all a state uses, and some it refuses.
_OPCODES = st.sampled_from(
    [
        pickle.MARK,
        pickle.STOP,
        pickle.POP,
        pickle.NONE,
        pickle.NEWTRUE,
        pickle.EMPTY_TUPLE,
        pickle.TUPLE1,
        pickle.TUPLE2,
        pickle.TUPLE3,
        pickle.TUPLE,
        pickle.EMPTY_DICT,
        pickle.EMPTY_SET,
        pickle.EMPTY_LIST,
        pickle.SETITEM,
        pickle.SETITEMS,
        pickle.ADDITEMS,
        pickle.MEMOIZE,
        pickle.BINGET + b"\x00",
        pickle.LONG_BINGET + b"\x01\x00\x00\x00",
        pickle.BINPUT + b"\x05",
        pickle.STACK_GLOBAL,
        pickle.NEWOBJ,
        pickle.REDUCE,
        pickle.BUILD,
        pickle.BININT1 + b"\x07",
        pickle.LONG1 + b"\xff",
        pickle.BINUNICODE + b"\xff\xff\xff\x7f",
        pickle.SHORT_BINUNICODE + b"\x02\xed\xa0",
        pickle.SHORT_BINBYTES + b"\x03abc",
        pickle.FROZENSET,
        pickle.GLOBAL + b"os\nsystem\n",
    ]
)


@st.composite
def hostile_torch_values(draw: st.DrawFn) -> bytes:
    """PyTorch's stored value of a real state with opcodes spliced in, or a bomb, or bytes."""
    kind = draw(st.sampled_from(["splice", "bomb", "flood", "raw", "base64"]))
    if kind == "bomb":
        return torch_state_around(shared_tuple_tree(draw(st.integers(1, 64))))
    if kind == "flood":  # one opcode many times: memory, not time
        opcode = draw(_OPCODES)
        return base64.b64encode(pickle.PROTO + b"\x04" + opcode * draw(st.integers(1, 300_000)))
    if kind == "raw":
        return draw(RAW_BYTES)
    pickled = base64.b64decode(encode_torch_state(TORCH_STATE))
    if kind == "base64":
        return base64.b64encode(draw(st.binary(max_size=2048)))
    at = draw(st.integers(0, len(pickled)))
    spliced = b"".join(draw(st.lists(_OPCODES, max_size=40)))
    cut = draw(st.integers(0, 16))
    return base64.b64encode(pickled[:at] + spliced + pickled[at + cut :])


TORCH_VALUES = hostile_torch_values()
