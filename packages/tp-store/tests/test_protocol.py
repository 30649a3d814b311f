"""Property tests of the sans-IO codec (``tp_store.protocol``) and unit tests of ``StoreState``.

The request side is checked for round trips, for streams split anywhere, and
for hostile input: random bytes and mutated valid streams must raise
``ProtocolError`` and nothing else, promptly, without allocating what a forged
length prefix claims. The reply side is checked the same way. ``StoreState``
is tested directly (no sockets), including a stateful model of its waiters.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
import tracemalloc
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, get_args

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tp_store.errors import ProtocolError
from tp_store.protocol import (
    EXTENSION_ACCEPT,
    EXTENSION_OFFER,
    INCOMPLETE,
    STATS_SCHEMA,
    VALIDATE_MAGIC,
    Add,
    Append,
    AuthChallenge,
    AuthProof,
    Barrier,
    CancelWait,
    Check,
    CompareSet,
    DeleteKey,
    Get,
    GetNumKeys,
    Incomplete,
    Limits,
    ListKeys,
    MultiGet,
    MultiSet,
    Opcode,
    Ping,
    QueueLen,
    QueuePop,
    QueuePush,
    Reply,
    ReplyBuffer,
    ReplyKind,
    ReplyParser,
    Request,
    RequestParser,
    ServerStats,
    SessionClose,
    SessionCompareSet,
    SessionOpen,
    SessionSet,
    SessionStats,
    SessionWill,
    Set,
    Stats,
    Validate,
    Wait,
    WaitAny,
    WaitGet,
    WaitKeepAlive,
    decode_stats,
    encode_bytes,
    encode_i64,
    encode_key_list,
    encode_queue_pop,
    encode_stats,
    encode_u8,
    encode_u32,
    encode_values,
    encode_wait_get,
)
from tp_store.server.state import BarrierWaiter, StoreState, Waiter

U64 = struct.Struct("<Q")
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
#: CI replays a fixed set of examples (a red CI is then reproducible); local runs explore.
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def configured(**overrides: Any) -> settings:
    """Hypothesis settings of this module: no per-example deadline (slow CI machines)."""
    return settings(deadline=None, derandomize=IN_CI, **overrides)


# ---------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------

KEYS = st.binary(max_size=24) | st.binary(min_size=100, max_size=300)
VALUES = st.binary(max_size=64) | st.binary(min_size=200, max_size=2000)
I64 = st.integers(I64_MIN, I64_MAX)
U32 = st.integers(0, 2**32 - 1)
KEY_TUPLES = st.lists(KEYS, max_size=6).map(tuple)

#: One strategy per request type; a test checks that none is missing.
REQUEST_STRATEGIES: dict[type, st.SearchStrategy[Any]] = {
    Validate: st.builds(Validate, U32),
    Set: st.builds(Set, KEYS, VALUES),
    CompareSet: st.builds(CompareSet, KEYS, VALUES, VALUES),
    Get: st.builds(Get, KEYS),
    Add: st.builds(Add, KEYS, I64),
    Check: st.builds(Check, KEY_TUPLES),
    Wait: st.builds(Wait, KEY_TUPLES),
    GetNumKeys: st.just(GetNumKeys()),
    DeleteKey: st.builds(DeleteKey, KEYS),
    Append: st.builds(Append, KEYS, VALUES),
    MultiGet: st.builds(MultiGet, KEY_TUPLES),
    MultiSet: st.builds(MultiSet, st.lists(st.tuples(KEYS, VALUES), max_size=5).map(tuple)),
    CancelWait: st.just(CancelWait()),
    Ping: st.builds(Ping, U32),
    QueuePush: st.builds(QueuePush, KEYS, VALUES),
    QueuePop: st.builds(QueuePop, KEYS),
    QueueLen: st.builds(QueueLen, KEYS),
    ListKeys: st.just(ListKeys()),
    Barrier: st.builds(Barrier, KEYS, I64),
    WaitGet: st.builds(WaitGet, KEY_TUPLES),
    Stats: st.just(Stats()),
    AuthChallenge: st.builds(AuthChallenge, KEYS),
    AuthProof: st.builds(AuthProof, KEYS),
    SessionOpen: st.builds(SessionOpen, I64),
    SessionSet: st.builds(SessionSet, KEYS, VALUES),
    SessionCompareSet: st.builds(SessionCompareSet, KEYS, VALUES, VALUES),
    SessionWill: st.builds(SessionWill, KEYS, VALUES),
    SessionClose: st.just(SessionClose()),
    WaitAny: st.builds(WaitAny, KEY_TUPLES),
    WaitKeepAlive: st.just(WaitKeepAlive()),
}
REQUESTS: st.SearchStrategy[Request] = st.one_of(*REQUEST_STRATEGIES.values())
VALIDATE = Validate().encode()


def parse_all(
    chunks: Iterable[bytes], limits: Limits | None = None
) -> tuple[list[Request], ProtocolError | None]:
    """Feed ``chunks`` one by one, draining after each; stop at the first ProtocolError.

    Any other exception propagates (and fails the test). Every request consumes
    at least one byte, so more requests than bytes would mean a parser loop.
    """
    parser = RequestParser(limits)
    parsed: list[Request] = []
    fed = 0
    try:
        for chunk in chunks:
            parser.feed(chunk)
            fed += len(chunk)
            for request in parser:
                parsed.append(request)
                assert len(parsed) <= fed, "the parser yields requests without consuming bytes"
    except ProtocolError as exc:
        return parsed, exc
    return parsed, None


def split_at(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """``data`` cut at the given offsets (any order, duplicates allowed)."""
    points = [0, *sorted({min(max(cut, 0), len(data)) for cut in cuts}), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(points)]


# ---------------------------------------------------------------------------
# (a) round trips, (b) split streams
# ---------------------------------------------------------------------------


def test_every_request_type_has_a_strategy() -> None:
    assert set(REQUEST_STRATEGIES) == set(get_args(Request))
    assert {getattr(cls, "opcode") for cls in REQUEST_STRATEGIES} == set(Opcode)  # noqa: B009


@given(REQUESTS)
@configured()
def test_request_round_trip(request: Request) -> None:
    parser = RequestParser()
    parser.feed(VALIDATE + request.encode())
    assert list(parser) == [Validate(), request]
    assert parser.buffered == 0


@given(REQUESTS)
@configured()
def test_every_proper_prefix_of_a_request_is_incomplete(request: Request) -> None:
    encoded = request.encode()
    for end in range(len(encoded)):
        parser = RequestParser()
        parser.feed(VALIDATE + encoded[:end])
        assert list(parser) == [Validate()]
        assert parser.buffered == end


@given(st.lists(REQUESTS, max_size=30), st.data())
@configured()
def test_stream_split_anywhere_parses_the_same(
    requests: list[Request], data: st.DataObject
) -> None:
    stream = VALIDATE + b"".join(request.encode() for request in requests)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=60), label="cuts")
    parsed, error = parse_all(split_at(stream, cuts))
    assert error is None
    assert parsed == [Validate(), *requests]


@given(st.lists(REQUESTS, max_size=8))
@configured(max_examples=50)
def test_stream_fed_one_byte_at_a_time(requests: list[Request]) -> None:
    stream = VALIDATE + b"".join(request.encode() for request in requests)
    parsed, error = parse_all(stream[i : i + 1] for i in range(len(stream)))
    assert error is None
    assert parsed == [Validate(), *requests]


@given(st.lists(REQUESTS, max_size=12), st.data())
@configured()
def test_truncated_stream_yields_a_prefix(requests: list[Request], data: st.DataObject) -> None:
    encoded = [VALIDATE, *(request.encode() for request in requests)]
    stream = b"".join(encoded)
    end = data.draw(st.integers(0, len(stream)), label="end")
    parser = RequestParser()
    parser.feed(stream[:end])
    parsed = list(parser)
    whole = [Validate(), *requests]
    assert parsed == whole[: len(parsed)]
    consumed = sum(len(item) for item in encoded[: len(parsed)])
    assert (
        consumed <= end < consumed + (len(encoded[len(parsed)]) if len(parsed) < len(whole) else 1)
    )
    assert parser.buffered == end - consumed


# ---------------------------------------------------------------------------
# (c) hostile input
# ---------------------------------------------------------------------------


@given(st.binary(max_size=3000), st.booleans(), st.data())
@configured()
def test_random_bytes_raise_only_protocol_error(
    data: bytes, validated: bool, draw: st.DataObject
) -> None:
    stream = (VALIDATE if validated else b"") + data
    cuts = draw.draw(st.lists(st.integers(0, len(stream)), max_size=10), label="cuts")
    parse_all(split_at(stream, cuts))


@given(st.binary(min_size=1, max_size=200))
@configured()
def test_random_bytes_with_a_valid_opcode_raise_only_protocol_error(data: bytes) -> None:
    for opcode in Opcode:
        parse_all([VALIDATE, bytes([opcode]) + data])


HUGE_LENGTHS = st.sampled_from(
    [2**63, 2**64 - 1, 2**62, 2**60, 2**32, 2**31, 8 * 1024 * 1024 + 1, 8 * 1024 + 1]
) | st.integers(0, 2**64 - 1)


@st.composite
def mutated_streams(draw: st.DrawFn) -> bytes:
    """A valid request stream with a few hostile mutations applied."""
    requests = draw(st.lists(REQUESTS, min_size=1, max_size=10))
    stream = bytearray(VALIDATE + b"".join(request.encode() for request in requests))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(
            st.sampled_from(["flip", "truncate", "insert", "delete", "length", "opcode", "splice"])
        )
        pos = draw(st.integers(0, len(stream)))
        if kind == "flip" and stream:
            index = min(pos, len(stream) - 1)
            stream[index] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del stream[pos:]
        elif kind == "insert":
            stream[pos:pos] = draw(st.binary(min_size=1, max_size=32))
        elif kind == "delete":
            del stream[pos : pos + draw(st.integers(1, 16))]
        elif kind == "length":
            stream[pos : pos + 8] = U64.pack(draw(HUGE_LENGTHS))
        elif kind == "opcode":
            stream[pos:pos] = bytes([draw(st.integers(0, 255))])
        else:  # splice in a piece of another valid request
            other = draw(REQUESTS).encode()
            start = draw(st.integers(0, len(other)))
            stream[pos:pos] = other[start:]
    return bytes(stream)


@given(mutated_streams(), st.data())
@configured(max_examples=300)
def test_mutated_streams_raise_only_protocol_error(stream: bytes, data: st.DataObject) -> None:
    whole = parse_all([stream])
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=12), label="cuts")
    chunked = parse_all(split_at(stream, cuts))
    # Parsing depends only on the bytes, never on how they were split.
    assert chunked[0] == whole[0]
    assert (chunked[1] is None) == (whole[1] is None)


@pytest.mark.parametrize("length", [2**63, 2**64 - 1, 2**62, 2**40])
@pytest.mark.parametrize(
    "prefix",
    [
        b"\x03",  # GET key
        b"\x01\x01\x00\x00\x00\x00\x00\x00\x00k",  # SET value
        b"\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",  # CAS desired
    ],
    ids=["key", "value", "desired"],
)
def test_huge_length_prefix_is_rejected_without_allocating(prefix: bytes, length: int) -> None:
    tracemalloc.start()
    try:
        parsed, error = parse_all([VALIDATE, prefix + U64.pack(length)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(error, ProtocolError)
    assert parsed == [Validate()]
    assert peak < 1 << 20


@pytest.mark.parametrize("opcode", [Opcode.CHECK, Opcode.WAIT, Opcode.MULTI_GET, Opcode.WAIT_GET])
@pytest.mark.parametrize("count", [2**63, 2**64 - 1, 2**40, 128 * 1024 + 1])
def test_huge_key_count_is_rejected_from_the_header_alone(opcode: Opcode, count: int) -> None:
    tracemalloc.start()
    try:
        _, error = parse_all([VALIDATE, bytes([opcode]) + U64.pack(count)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(error, ProtocolError)
    assert peak < 1 << 20


@pytest.mark.parametrize("count", [-1, I64_MIN, 128 * 1024 + 1, I64_MAX])
def test_bad_multi_set_count_is_rejected_from_the_header_alone(count: int) -> None:
    _, error = parse_all([VALIDATE, b"\x0b" + struct.pack("<q", count)])
    assert isinstance(error, ProtocolError)


def test_claimed_size_within_the_limit_is_not_preallocated() -> None:
    # An 8 MiB value is allowed, but nothing may be reserved before it arrives.
    tracemalloc.start()
    try:
        parser = RequestParser()
        parser.feed(VALIDATE + b"\x01" + U64.pack(1) + b"k" + U64.pack(8 * 1024 * 1024))
        parsed = list(parser)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert parsed == [Validate()]
    assert peak < 1 << 20


# ---------------------------------------------------------------------------
# (d) limits and the handshake
# ---------------------------------------------------------------------------

SMALL = Limits(max_key_bytes=8, max_value_bytes=16, max_keys_per_request=3)

KEY_USES: dict[str, Callable[[bytes], Request]] = {
    "get": Get,
    "set": lambda k: Set(k, b"v"),
    "compare_set": lambda k: CompareSet(k, b"", b"v"),
    "add": lambda k: Add(k, 1),
    "delete": DeleteKey,
    "append": lambda k: Append(k, b"v"),
    "queue_push": lambda k: QueuePush(k, b"v"),
    "queue_pop": QueuePop,
    "queue_len": QueueLen,
    "barrier": lambda k: Barrier(k, 2),
    "check": lambda k: Check((b"a", k)),
    "wait": lambda k: Wait((k,)),
    "multi_get": lambda k: MultiGet((b"a", k)),
    "wait_get": lambda k: WaitGet((k,)),
    "multi_set": lambda k: MultiSet(((b"a", b"v"), (k, b"v"))),
}
VALUE_USES: dict[str, Callable[[bytes], Request]] = {
    "set": lambda v: Set(b"k", v),
    "compare_set_expected": lambda v: CompareSet(b"k", v, b""),
    "compare_set_desired": lambda v: CompareSet(b"k", b"", v),
    "append": lambda v: Append(b"k", v),
    "queue_push": lambda v: QueuePush(b"k", v),
    "multi_set": lambda v: MultiSet(((b"a", b""), (b"k", v))),
}
COUNT_USES: dict[str, Callable[[int], Request]] = {
    "check": lambda n: Check(tuple(b"%d" % i for i in range(n))),
    "wait": lambda n: Wait(tuple(b"%d" % i for i in range(n))),
    "multi_get": lambda n: MultiGet(tuple(b"%d" % i for i in range(n))),
    "wait_get": lambda n: WaitGet(tuple(b"%d" % i for i in range(n))),
    "multi_set": lambda n: MultiSet(tuple((b"%d" % i, b"") for i in range(n))),
}


def _rejected_when_prefix_arrives(encoded: bytes, field: bytes, limits: Limits) -> None:
    """The request is rejected as soon as ``field`` (a length or count) has arrived."""
    end = encoded.index(field) + len(field)
    parsed, error = parse_all([VALIDATE, encoded[:end]], limits)
    assert isinstance(error, ProtocolError), f"accepted {encoded[:end]!r}"
    assert parsed == [Validate()]


@pytest.mark.parametrize("use", list(KEY_USES.values()), ids=list(KEY_USES))
def test_key_length_limit(use: Callable[[bytes], Request]) -> None:
    at_limit = use(b"K" * SMALL.max_key_bytes)
    assert parse_all([VALIDATE, at_limit.encode()], SMALL) == ([Validate(), at_limit], None)
    over = use(b"K" * (SMALL.max_key_bytes + 1)).encode()
    _rejected_when_prefix_arrives(over, U64.pack(SMALL.max_key_bytes + 1), SMALL)


@pytest.mark.parametrize("use", list(VALUE_USES.values()), ids=list(VALUE_USES))
def test_value_length_limit(use: Callable[[bytes], Request]) -> None:
    at_limit = use(b"V" * SMALL.max_value_bytes)
    assert parse_all([VALIDATE, at_limit.encode()], SMALL) == ([Validate(), at_limit], None)
    over = use(b"V" * (SMALL.max_value_bytes + 1)).encode()
    _rejected_when_prefix_arrives(over, U64.pack(SMALL.max_value_bytes + 1), SMALL)


@pytest.mark.parametrize("use", list(COUNT_USES.values()), ids=list(COUNT_USES))
def test_key_count_limit(use: Callable[[int], Request]) -> None:
    at_limit = use(SMALL.max_keys_per_request)
    assert parse_all([VALIDATE, at_limit.encode()], SMALL) == ([Validate(), at_limit], None)
    over = use(SMALL.max_keys_per_request + 1).encode()
    # The count follows the opcode: the header alone is enough to reject.
    _, error = parse_all([VALIDATE, over[:9]], SMALL)
    assert isinstance(error, ProtocolError)


def test_default_limits_are_pytorchs() -> None:
    limits = Limits()
    assert (limits.max_key_bytes, limits.max_value_bytes, limits.max_keys_per_request) == (
        8 * 1024,
        8 * 1024 * 1024,
        128 * 1024,
    )
    _, error = parse_all([VALIDATE, Get(b"k" * (8 * 1024 + 1)).encode()])
    assert isinstance(error, ProtocolError)
    assert parse_all([VALIDATE, Get(b"k" * 8 * 1024).encode()])[1] is None


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "8"])
def test_limits_reject_non_positive_ints(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_key_bytes"):
        Limits(max_key_bytes=bad)


@given(REQUEST_STRATEGIES[Get] | REQUEST_STRATEGIES[Set] | REQUEST_STRATEGIES[Ping])
@configured()
def test_first_message_must_be_validate(request: Request) -> None:
    parsed, error = parse_all([request.encode()])
    assert isinstance(error, ProtocolError)
    assert parsed == []


@given(U32.filter(lambda magic: magic != VALIDATE_MAGIC))
@configured()
def test_first_validate_needs_the_magic(magic: int) -> None:
    parsed, error = parse_all([Validate(magic).encode(), Ping(1).encode()])
    assert isinstance(error, ProtocolError)
    assert parsed == []


def test_validate_bytes_and_later_validates() -> None:
    assert struct.pack("<BI", 0, 0x3C85F7CE) == VALIDATE
    # Only the first message is checked; a later VALIDATE is an ordinary request.
    assert parse_all([VALIDATE, Validate(7).encode()]) == ([Validate(), Validate(7)], None)
    assert parse_all([]) == ([], None)


@pytest.mark.parametrize("opcode", sorted(set(range(256)) - set(Opcode)))
def test_unknown_opcodes_are_rejected(opcode: int) -> None:
    _, error = parse_all([VALIDATE, bytes([opcode])])
    assert isinstance(error, ProtocolError)


def test_wire_bytes_of_a_few_requests() -> None:
    # Pinned against the spec's table, so a codec change cannot drift unnoticed.
    assert Set(b"k", b"vv").encode() == b"\x01" + U64.pack(1) + b"k" + U64.pack(2) + b"vv"
    assert Add(b"k", -2).encode() == b"\x04" + U64.pack(1) + b"k" + struct.pack("<q", -2)
    assert Wait((b"a",)).encode() == b"\x06" + U64.pack(1) + U64.pack(1) + b"a"
    assert MultiSet(((b"a", b"b"),)).encode() == (
        b"\x0b" + struct.pack("<q", 1) + U64.pack(1) + b"a" + U64.pack(1) + b"b"
    )
    assert Ping(5).encode() == b"\x0d" + struct.pack("<I", 5)
    assert Barrier(b"b", 3).encode() == b"\x12" + U64.pack(1) + b"b" + struct.pack("<q", 3)
    assert WaitGet((b"a",)).encode() == b"\xe0" + U64.pack(1) + U64.pack(1) + b"a"
    assert Stats().encode() == b"\xe1"
    assert len({EXTENSION_OFFER, EXTENSION_ACCEPT}) == 2
    assert min(EXTENSION_OFFER, EXTENSION_ACCEPT) >= 2**22  # never a pid, which torch sends


# ---------------------------------------------------------------------------
# (e) replies
# ---------------------------------------------------------------------------

ReplyCase = tuple[ReplyKind, int, bytes, Any]


@st.composite
def reply_cases(draw: st.DrawFn, kind: ReplyKind | None = None) -> ReplyCase:
    """(kind, count, encoded bytes, the value ReplyParser must return)."""
    kind = kind or draw(st.sampled_from(list(ReplyKind)))
    values = st.lists(VALUES, max_size=5)
    if kind is ReplyKind.U8:
        value = draw(st.sampled_from([0, 1]))
        return kind, 0, encode_u8(value), value
    if kind is ReplyKind.U32:
        value = draw(U32)
        return kind, 0, encode_u32(value), value
    if kind is ReplyKind.I64:
        value = draw(I64)
        return kind, 0, encode_i64(value), value
    if kind is ReplyKind.BYTES:
        blob = draw(VALUES)
        return kind, 0, encode_bytes(blob), blob
    if kind is ReplyKind.VALUES:
        items = draw(values)
        return kind, len(items), encode_values(items), items
    if kind is ReplyKind.KEY_LIST:
        items = draw(values)
        return kind, 0, encode_key_list(items), items
    if kind is ReplyKind.QUEUE_POP:
        if draw(st.booleans()):
            return kind, 0, encode_queue_pop(0, None), (0, None)
        length, blob = draw(st.integers(1, I64_MAX)), draw(VALUES)
        return kind, 0, encode_queue_pop(length, blob), (length, blob)
    assert kind is ReplyKind.WAIT_GET
    items = draw(values)
    if draw(st.booleans()):
        return kind, len(items), b"\x01", (1, None)
    return kind, len(items), encode_wait_get(items), (0, items)


def read_replies(cases: Sequence[ReplyCase], chunks: Iterable[bytes]) -> list[Reply | Incomplete]:
    parser = ReplyParser()
    for kind, count, _, _ in cases:
        parser.expect(kind, count)
    replies: list[Reply | Incomplete] = []
    for chunk in [b"", *chunks]:  # a zero-byte reply (MULTI_GET of no keys) needs no chunk
        parser.feed(chunk)
        while not isinstance(reply := parser.next_reply(), Incomplete):
            replies.append(reply)
    assert parser.next_reply() is INCOMPLETE
    return replies


@given(st.lists(reply_cases(), max_size=12), st.data())
@configured()
def test_replies_round_trip_split_anywhere(cases: list[ReplyCase], data: st.DataObject) -> None:
    stream = b"".join(case[2] for case in cases)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=40), label="cuts")
    assert read_replies(cases, split_at(stream, cuts)) == [case[3] for case in cases]


@given(st.lists(reply_cases(), max_size=6))
@configured(max_examples=50)
def test_replies_one_byte_at_a_time(cases: list[ReplyCase]) -> None:
    stream = b"".join(case[2] for case in cases)
    chunks = [stream[i : i + 1] for i in range(len(stream))]
    assert read_replies(cases, chunks) == [case[3] for case in cases]


@pytest.mark.parametrize("kind", list(ReplyKind), ids=lambda kind: kind.name)
@given(data=st.data())
@configured()
def test_every_reply_kind_round_trips(kind: ReplyKind, data: st.DataObject) -> None:
    case = data.draw(reply_cases(kind))
    _, count, encoded, expected = case
    for end in range(len(encoded)):
        parser = ReplyParser()
        parser.expect(kind, count)
        parser.feed(encoded[:end])
        assert parser.next_reply() is INCOMPLETE
    # Expectations may also be announced after the bytes arrived.
    parser = ReplyParser()
    parser.feed(encoded)
    parser.expect(kind, count)
    assert parser.next_reply() == expected
    assert parser.next_reply() is INCOMPLETE


#: The formats a client reads its common replies with without a buffer (ReplyFormat.whole).
WHOLE_KINDS: Final = (ReplyKind.U8, ReplyKind.I64, ReplyKind.BYTES, ReplyKind.WAIT_GET)


def whole(kind: ReplyKind, data: bytes, count: int, limits: Limits | None = None) -> object:
    """``kind``'s whole-reply reading of ``data``, from a bigger receive buffer."""
    space = bytearray(data) + b"\xee" * 16  # what a buffer holds past the reply is not read
    return kind.value.whole(space, len(data), count, limits or Limits())


@pytest.mark.parametrize("kind", list(ReplyKind), ids=lambda kind: kind.name)
@given(data=st.data())
@configured()
def test_a_whole_reply_reads_as_the_buffer_reads_it(kind: ReplyKind, data: st.DataObject) -> None:
    _, count, encoded, expected = data.draw(reply_cases(kind))
    value = whole(kind, encoded, count)
    if kind in WHOLE_KINDS and (kind is not ReplyKind.WAIT_GET or (count == 1 and expected[1])):
        assert value == expected
    else:  # no such path, or not a get's reply: the general path reads it
        assert value is INCOMPLETE
    # Anything but exactly one reply is left to the general path.
    for end in range(len(encoded)):
        assert whole(kind, encoded[:end], count) is INCOMPLETE
    extra = data.draw(st.binary(min_size=1, max_size=9), label="extra")
    assert whole(kind, encoded + extra, count) is INCOMPLETE


@pytest.mark.parametrize(
    ("kind", "payload", "count"),
    [
        (ReplyKind.U8, b"\x02", 0),
        (ReplyKind.U8, b"\xff", 0),
        (ReplyKind.WAIT_GET, b"\x02" + U64.pack(1) + b"v", 1),
        (ReplyKind.BYTES, U64.pack(101) + b"v" * 101, 0),
        (ReplyKind.WAIT_GET, b"\x00" + U64.pack(101) + b"v" * 101, 1),
    ],
)
def test_a_bad_or_oversized_whole_reply_is_left_to_the_buffer(
    kind: ReplyKind, payload: bytes, count: int
) -> None:
    limits = Limits(max_value_bytes=100, max_message_bytes=1 + 16 + 8 * 1024 + 100)
    assert whole(kind, payload, count, limits) is INCOMPLETE
    buffer = ReplyBuffer(limits)
    buffer.feed(payload)
    with pytest.raises(ProtocolError):
        buffer.read(kind.value, count)


@given(st.binary(min_size=1, max_size=64))
@configured()
def test_reply_bytes_nobody_asked_for(data: bytes) -> None:
    parser = ReplyParser()
    parser.feed(data)
    with pytest.raises(ProtocolError):
        parser.next_reply()


@given(reply_cases(), st.binary(min_size=1, max_size=16))
@configured()
def test_bytes_after_the_expected_replies(case: ReplyCase, extra: bytes) -> None:
    kind, count, encoded, expected = case
    parser = ReplyParser()
    parser.expect(kind, count)
    parser.feed(encoded + extra)
    assert parser.next_reply() == expected
    with pytest.raises(ProtocolError):
        parser.next_reply()


@pytest.mark.parametrize(
    ("kind", "payload"),
    [
        (ReplyKind.U8, b"\x02"),
        (ReplyKind.U8, b"\xff"),
        (ReplyKind.WAIT_GET, b"\x02"),
        (ReplyKind.KEY_LIST, struct.pack("<q", -1)),
        (ReplyKind.QUEUE_POP, struct.pack("<q", I64_MIN)),
    ],
)
def test_reply_values_the_protocol_does_not_define(kind: ReplyKind, payload: bytes) -> None:
    parser = ReplyParser()
    parser.expect(kind)
    parser.feed(payload)
    with pytest.raises(ProtocolError):
        parser.next_reply()


@given(
    st.lists(st.tuples(st.sampled_from(list(ReplyKind)), st.integers(0, 4)), max_size=6),
    st.binary(max_size=400),
)
@configured()
def test_random_reply_bytes_raise_only_protocol_error(
    expected: list[tuple[ReplyKind, int]], data: bytes
) -> None:
    parser = ReplyParser()
    for kind, count in expected:
        parser.expect(kind, count)
    parser.feed(data)
    replies = 0
    try:
        while not isinstance(parser.next_reply(), Incomplete):
            replies += 1
            assert replies <= len(expected)
    except ProtocolError:
        pass


def test_a_huge_reply_length_is_refused_without_allocating() -> None:
    tracemalloc.start()
    try:
        parser = ReplyParser()
        parser.expect(ReplyKind.BYTES)
        parser.feed(U64.pack(2**63))
        with pytest.raises(ProtocolError, match="exceeds the limit of 8388608"):
            parser.next_reply()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_reply_lengths_are_bounded_by_the_clients_limits() -> None:
    limits = Limits(max_value_bytes=100, max_message_bytes=1 + 16 + 8 * 1024 + 100)
    parser = ReplyParser(limits)
    parser.expect(ReplyKind.BYTES)
    parser.feed(U64.pack(100) + b"v" * 100)
    assert parser.next_reply() == b"v" * 100
    parser.expect(ReplyKind.BYTES)
    parser.feed(U64.pack(101))
    with pytest.raises(ProtocolError, match="value of 101 bytes"):
        parser.next_reply()
    # Many values, each within the limit, cannot add up past the message limit.
    parser = ReplyParser(limits)
    parser.expect(ReplyKind.VALUES, 1000)
    parser.feed((U64.pack(100) + b"v" * 100) * 90)
    with pytest.raises(ProtocolError, match="a reply of at least"):
        parser.next_reply()


def test_reply_parser_clear_forgets_everything() -> None:
    parser = ReplyParser()
    parser.expect(ReplyKind.I64)
    parser.feed(b"\x01\x02")
    parser.clear()
    assert parser.next_reply() is INCOMPLETE
    parser.expect(ReplyKind.U8)
    parser.feed(b"\x01")
    assert parser.next_reply() == 1


# ---------------------------------------------------------------------------
# (f) the STATS document
# ---------------------------------------------------------------------------

COUNTS = st.integers(0, 2**63 - 1)


def server_stats(**overrides: Any) -> dict[str, Any]:
    """A valid stats document as a plain dict, with some fields replaced."""
    stats: dict[str, Any] = {
        "schema": STATS_SCHEMA,
        "tp_store_version": "0.1.0",
        "uptime_seconds": 12.5,
        "connections_open": 2,
        "connections_accepted": 7,
        "connections_protocol_errors": 1,
        "connections_refused": 0,
        "connections_timed_out": 0,
        "connections_auth_failures": 0,
        "waiters_parked": 1,
        "keys": 3,
        "bytes_received": 400,
        "bytes_sent": 300,
        "ops": {opcode.name.lower(): 1 for opcode in Opcode},
        "sessions_open": 1,
        "sessions_opened": 4,
        "sessions_ended_closed": 1,
        "sessions_ended_disconnected": 1,
        "sessions_ended_expired": 1,
    }
    stats.update(overrides)
    return stats


@given(
    st.fixed_dictionaries(
        {
            "schema": st.just(STATS_SCHEMA),
            "tp_store_version": st.text(max_size=20),
            "uptime_seconds": st.floats(0, 1e9) | st.integers(0, 2**40),
            "connections_open": COUNTS,
            "connections_accepted": COUNTS,
            "connections_protocol_errors": COUNTS,
            "connections_refused": COUNTS,
            "connections_timed_out": COUNTS,
            "connections_auth_failures": COUNTS,
            "waiters_parked": COUNTS,
            "keys": COUNTS,
            "bytes_received": COUNTS,
            "bytes_sent": COUNTS,
            "ops": st.dictionaries(st.text(max_size=12), COUNTS, max_size=25),
        }
    ),
    st.data(),
)
@configured()
def test_stats_round_trip_as_a_bytes_reply(stats: ServerStats, data: st.DataObject) -> None:
    encoded = encode_stats(stats)
    cuts = data.draw(st.lists(st.integers(0, len(encoded)), max_size=4))
    replies = read_replies([(ReplyKind.BYTES, 0, encoded, None)], split_at(encoded, cuts))
    assert len(replies) == 1
    assert isinstance(replies[0], bytes)
    assert decode_stats(replies[0]) == stats


def test_stats_keep_fields_a_newer_server_adds() -> None:
    document = json.dumps(server_stats(queues=4)).encode()
    assert decode_stats(document)["queues"] == 4  # type: ignore[typeddict-item]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (b"not json", "not a JSON document"),
        (b"\xff\xfe", "not a JSON document"),
        (b"[" * 100_000 + b"]" * 100_000, "not a JSON document"),
        (b"[1, 2]", "must be a JSON object, got list"),
        (json.dumps(server_stats(schema=2)).encode(), "schema 2 is not the known 1"),
        (json.dumps(server_stats(schema=True)).encode(), "schema True"),
        (json.dumps(server_stats(schema=None)).encode(), "schema None"),
        (json.dumps(server_stats(keys=-1)).encode(), "'keys' must be a count, got -1"),
        (json.dumps(server_stats(bytes_sent=1.5)).encode(), "'bytes_sent' must be a count"),
        (json.dumps(server_stats(waiters_parked=False)).encode(), "'waiters_parked' must be"),
        (json.dumps(server_stats(uptime_seconds="1")).encode(), "must be a number, got '1'"),
        (json.dumps(server_stats(uptime_seconds=-1)).encode(), "out of range: -1"),
        (json.dumps(server_stats(uptime_seconds=float("nan"))).encode(), "out of range: nan"),
        (json.dumps(server_stats(uptime_seconds=float("inf"))).encode(), "out of range: inf"),
        (json.dumps(server_stats(tp_store_version=1)).encode(), "must be a string, got 1"),
        (json.dumps(server_stats(ops=[1])).encode(), "'ops' must map names to counts"),
        (json.dumps(server_stats(ops={"set": -1})).encode(), "'ops' must map names to counts"),
        (json.dumps(server_stats(sessions_open=-1)).encode(), "'sessions_open' must be a count"),
        (json.dumps(server_stats(sessions_ended_expired="1")).encode(), "'sessions_ended_exp"),
    ],
    ids=lambda value: value[:40] if isinstance(value, str) else None,
)
def test_bad_stats_documents_are_rejected(document: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        decode_stats(document)


def test_a_stats_document_without_session_counts_is_a_server_without_sessions() -> None:
    older = server_stats()
    for field in SessionStats.__annotations__:
        del older[field]
    assert decode_stats(json.dumps(older).encode()) == older


@pytest.mark.parametrize("field", sorted(ServerStats.__required_keys__))
def test_a_stats_document_missing_a_field_is_rejected(field: str) -> None:
    stats = server_stats()
    del stats[field]
    with pytest.raises(ProtocolError, match=field if field != "schema" else "schema None"):
        decode_stats(json.dumps(stats).encode())


# ---------------------------------------------------------------------------
# StoreState
# ---------------------------------------------------------------------------


class Woken:
    """Records wake callbacks in order."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, waiter: Any) -> None:
        self.calls.append(waiter)


def parked(state: StoreState, keys: Sequence[bytes], woken: Woken) -> Waiter:
    waiter = Waiter(tuple(keys), woken)
    assert state.park(waiter) is False
    return waiter


def no_waiters_left(state: StoreState) -> bool:
    return not state._waiters and not state._barriers


def test_compare_set_missing_key_with_empty_expected_creates_it() -> None:
    state = StoreState()
    assert state.compare_set(b"k", b"", b"new") == b"new"
    assert state.data == {b"k": b"new"}


def test_compare_set_missing_key_with_expected_value_stores_nothing() -> None:
    state = StoreState()
    assert state.compare_set(b"k", b"old", b"new") == b"old"
    assert state.data == {}


def test_compare_set_present_key() -> None:
    state = StoreState()
    state.set(b"k", b"old")
    assert state.compare_set(b"k", b"other", b"new") == b"old"
    assert state.data[b"k"] == b"old"
    assert state.compare_set(b"k", b"ol", b"new") == b"old"  # byte for byte, not a prefix
    assert state.compare_set(b"k", b"old", b"new") == b"new"
    assert state.data[b"k"] == b"new"
    # An empty expected value matches only an empty present value.
    assert state.compare_set(b"k", b"", b"x") == b"new"
    state.set(b"e", b"")
    assert state.compare_set(b"e", b"", b"x") == b"x"


def test_add_counts_from_zero_and_returns_the_total() -> None:
    state = StoreState()
    assert state.add(b"c", 5) == 5
    assert state.add(b"c", -7) == -2
    assert state.data[b"c"] == b"-2"
    state.set(b"d", b"41")
    assert state.add(b"d", 1) == 42


@pytest.mark.parametrize("value", [b"abc", b"1.5", b"0x10", b"12abc", b"\xff"])
def test_add_on_a_non_integer_raises_naming_the_key(value: bytes) -> None:
    state = StoreState()
    state.set(b"my-counter", value)
    with pytest.raises(ValueError, match="my-counter"):
        state.add(b"my-counter", 1)
    assert state.data[b"my-counter"] == value


def test_add_outside_int64_raises_and_keeps_the_value() -> None:
    state = StoreState()
    state.add(b"c", I64_MAX)
    with pytest.raises(OverflowError, match="int64"):
        state.add(b"c", 1)
    assert state.data[b"c"] == str(I64_MAX).encode()


WRITES: dict[str, Callable[[StoreState, bytes], object]] = {
    "set": lambda state, key: state.set(key, b"v"),
    "add": lambda state, key: state.add(key, 3),
    "append": lambda state, key: state.append(key, b"v"),
    "compare_set": lambda state, key: state.compare_set(key, b"", b"v"),
    "multi_set": lambda state, key: state.multi_set([(b"other", b"x"), (key, b"v")]),
    "queue_push": lambda state, key: state.queue_push(key, b"v"),
}


@pytest.mark.parametrize("write", list(WRITES.values()), ids=list(WRITES))
def test_each_write_wakes_a_waiter(write: Callable[[StoreState, bytes], object]) -> None:
    state = StoreState()
    woken = Woken()
    waiter = parked(state, [b"k"], woken)
    write(state, b"unrelated")
    assert woken.calls == []
    write(state, b"k")
    assert woken.calls == [waiter]
    assert no_waiters_left(state)


def test_compare_set_that_does_not_write_wakes_nobody() -> None:
    state = StoreState()
    woken = Woken()
    parked(state, [b"k"], woken)
    assert state.compare_set(b"k", b"expected", b"v") == b"expected"
    assert woken.calls == []
    state.compare_set(b"k", b"", b"v")
    assert len(woken.calls) == 1


def test_delete_and_reads_wake_nobody() -> None:
    state = StoreState()
    woken = Woken()
    parked(state, [b"k"], woken)
    state.delete(b"k")
    state.get(b"k")
    state.check([b"k"])
    state.queue_pop(b"k")
    assert woken.calls == []


def test_multi_key_waiter_wakes_only_when_all_exist() -> None:
    state = StoreState()
    woken = Woken()
    state.set(b"a", b"1")
    waiter = parked(state, [b"a", b"b", b"c", b"b"], woken)  # duplicates count once
    state.set(b"b", b"1")
    state.set(b"b", b"2")  # a second write of the same key is not a new key
    assert woken.calls == []
    state.set(b"c", b"1")
    assert woken.calls == [waiter]
    state.set(b"c", b"2")
    assert woken.calls == [waiter]  # woken once
    assert no_waiters_left(state)


def test_multi_set_wakes_a_multi_key_waiter_once() -> None:
    state = StoreState()
    woken = Woken()
    waiter = parked(state, [b"a", b"b"], woken)
    state.multi_set([(b"a", b"1"), (b"b", b"2")])
    assert woken.calls == [waiter]


def test_park_on_existing_keys_returns_at_once_and_keeps_nothing() -> None:
    state = StoreState()
    state.set(b"a", b"")
    state.queue_push(b"q", b"x")
    woken = Woken()
    assert state.park(Waiter((b"a", b"q"), woken)) is True
    assert state.park(Waiter((), woken)) is True
    assert woken.calls == []
    assert no_waiters_left(state)


def test_every_waiter_on_a_key_is_woken_in_arrival_order() -> None:
    state = StoreState()
    woken = Woken()
    waiters = [parked(state, [b"k"], woken) for _ in range(5)]
    state.set(b"k", b"v")
    assert woken.calls == waiters


def test_queue_push_wakes_exactly_one_waiter() -> None:
    state = StoreState()
    woken = Woken()
    first, second, third = (parked(state, [b"q"], woken) for _ in range(3))
    state.queue_push(b"q", b"1")
    assert woken.calls == [first]
    assert state.exists(b"q")
    assert state.queue_pop(b"q") == (1, b"1")
    assert not state.exists(b"q")
    state.queue_push(b"q", b"2")
    assert woken.calls == [first, second]
    state.queue_push(b"q", b"3")
    assert woken.calls == [first, second, third]
    assert state.queue_len(b"q") == 2
    assert no_waiters_left(state)


def test_queue_pop_reports_the_length_before_the_pop() -> None:
    state = StoreState()
    assert state.queue_pop(b"q") == (0, None)
    for value in (b"a", b"b", b"c"):
        state.queue_push(b"q", value)
    assert [state.queue_pop(b"q") for _ in range(4)] == [(3, b"a"), (2, b"b"), (1, b"c"), (0, None)]


def test_unpark_removes_cleanly() -> None:
    state = StoreState()
    woken = Woken()
    gone = parked(state, [b"a", b"b", b"a"], woken)
    stays = parked(state, [b"b"], woken)
    state.unpark(gone)
    state.unpark(gone)  # idempotent
    assert set(state._waiters) == {b"b"}
    state.set(b"a", b"1")
    state.set(b"b", b"1")
    assert woken.calls == [stays]
    assert no_waiters_left(state)


def test_barrier_completes_at_world_size() -> None:
    state = StoreState()
    woken = Woken()
    members = [BarrierWaiter(b"bar", 3, woken) for _ in range(3)]
    assert state.barrier(members[0]) is False
    assert state.barrier(members[1]) is False
    assert woken.calls == []
    assert state.barrier(members[2]) is True
    # The last arrival is answered directly; the parked ones are woken.
    assert woken.calls == members[:2]
    assert state.data[b"bar"] == b"3"
    assert no_waiters_left(state)


def test_barrier_count_wakes_key_waiters() -> None:
    state = StoreState()
    woken = Woken()
    waiter = parked(state, [b"bar"], woken)
    state.barrier(BarrierWaiter(b"bar", 2, woken))
    assert woken.calls == [waiter]


def test_barrier_of_one_completes_immediately() -> None:
    state = StoreState()
    woken = Woken()
    assert state.barrier(BarrierWaiter(b"solo", 1, woken)) is True
    assert woken.calls == []
    assert no_waiters_left(state)


def test_barrier_on_a_non_integer_key_raises_and_parks_nothing() -> None:
    state = StoreState()
    state.set(b"bar", b"text")
    with pytest.raises(ValueError, match="bar"):
        state.barrier(BarrierWaiter(b"bar", 2, Woken()))
    assert no_waiters_left(state)


def test_leave_barrier_removes_cleanly() -> None:
    state = StoreState()
    woken = Woken()
    leaver, stayer, last = (BarrierWaiter(b"bar", 3, woken) for _ in range(3))
    state.barrier(leaver)
    state.barrier(stayer)
    state.leave_barrier(leaver)
    state.leave_barrier(leaver)  # idempotent
    state.leave_barrier(BarrierWaiter(b"never-joined", 2, woken))
    # Leaving does not uncount: the count is already 2, the next arrival completes.
    assert state.barrier(last) is True
    assert woken.calls == [stayer]
    assert no_waiters_left(state)


def test_watch_runs_on_every_write_until_it_returns_true() -> None:
    state = StoreState()
    seen: list[bytes] = []

    def until_three(value: bytes) -> bool:
        seen.append(value)
        return value == b"3"

    state.set(b"init/", b"1")
    state.watch(b"init/", until_three)  # runs at once on the current value
    assert seen == [b"1"]
    state.add(b"init/", 1)
    state.set(b"other", b"x")
    state.append(b"init/", b"")  # a write of the same value still counts
    state.add(b"init/", 1)
    state.add(b"init/", 1)
    assert seen == [b"1", b"2", b"2", b"3"]
    assert not state._watches


def test_watch_that_is_satisfied_at_once_is_not_kept() -> None:
    state = StoreState()
    state.set(b"k", b"v")
    calls: list[bytes] = []

    def record(value: bytes) -> bool:
        calls.append(value)
        return True

    state.watch(b"k", record)
    state.set(b"k", b"w")
    assert calls == [b"v"]


def test_watch_on_a_missing_key_waits_for_the_first_write() -> None:
    state = StoreState()
    calls: list[bytes] = []

    def until_b(value: bytes) -> bool:
        calls.append(value)
        return value == b"b"

    state.watch(b"k", until_b)
    assert calls == []
    state.set(b"k", b"a")
    state.set(b"k", b"b")
    state.set(b"k", b"c")
    assert calls == [b"a", b"b"]


def test_reads() -> None:
    state = StoreState()
    state.multi_set([(b"a", b"1"), (b"b", b"")])
    state.queue_push(b"q", b"x")
    assert state.get(b"missing") == b""
    assert state.multi_get([b"a", b"missing", b"b"]) == [b"1", b"", b""]
    assert state.num_keys() == 2  # queues are not keys of the map
    assert sorted(state.list_keys()) == [b"a", b"b"]
    assert state.check([b"a", b"b", b"q"]) is True
    assert state.check([b"a", b"missing"]) is False
    assert state.check([]) is True
    assert state.delete(b"a") is True
    assert state.delete(b"a") is False


# ---------------------------------------------------------------------------
# A stateful model of the waiters
# ---------------------------------------------------------------------------

MODEL_KEYS = [b"a", b"b", b"c", b"d"]


class WaiterMachine(RuleBasedStateMachine):
    """Random writes, deletes, parks and unparks against a simple model.

    The model: a waiter parks on the keys missing at that moment and is woken,
    exactly once, when each of them has been written since (waking is
    count-based, so a later delete does not undo a key's arrival).
    """

    def __init__(self) -> None:
        super().__init__()
        self.state = StoreState()
        self.present: set[bytes] = set()
        self.woken: list[Waiter] = []
        self.outstanding: dict[Waiter, set[bytes]] = {}
        self.done: list[Waiter] = []

    def _wrote(self, key: bytes) -> None:
        self.present.add(key)
        for waiter, missing in list(self.outstanding.items()):
            missing.discard(key)
            if not missing:
                del self.outstanding[waiter]
                self.done.append(waiter)

    @rule(key=st.sampled_from(MODEL_KEYS), value=st.binary(max_size=3))
    def set(self, key: bytes, value: bytes) -> None:
        self.state.set(key, value)
        self._wrote(key)

    @rule(key=st.sampled_from(MODEL_KEYS), value=st.binary(max_size=3))
    def append(self, key: bytes, value: bytes) -> None:
        self.state.append(key, value)
        self._wrote(key)

    @rule(key=st.sampled_from(MODEL_KEYS), expected=st.sampled_from([b"", b"x"]))
    def compare_set(self, key: bytes, expected: bytes) -> None:
        before = self.state.data.get(key)
        self.state.compare_set(key, expected, b"x")
        writes = (before is None and expected == b"") or (before is not None and before == expected)
        if writes:
            self._wrote(key)
        else:
            assert self.state.data.get(key) == before

    @rule(items=st.lists(st.tuples(st.sampled_from(MODEL_KEYS), st.just(b"1")), max_size=3))
    def multi_set(self, items: list[tuple[bytes, bytes]]) -> None:
        self.state.multi_set(items)
        for key, _ in items:
            self._wrote(key)

    @rule(key=st.sampled_from(MODEL_KEYS))
    def delete(self, key: bytes) -> None:
        assert self.state.delete(key) is (key in self.present)
        self.present.discard(key)

    @rule(keys=st.lists(st.sampled_from(MODEL_KEYS), max_size=4))
    def park(self, keys: list[bytes]) -> None:
        waiter = Waiter(tuple(keys), self.woken.append)
        missing = set(keys) - self.present
        assert self.state.park(waiter) is (not missing)
        if missing:
            self.outstanding[waiter] = missing

    @precondition(lambda self: bool(self.outstanding))
    @rule(data=st.data())
    def unpark(self, data: st.DataObject) -> None:
        waiter = data.draw(st.sampled_from(list(self.outstanding)))
        self.state.unpark(waiter)
        del self.outstanding[waiter]

    @invariant()
    def woken_exactly_the_completed_waiters(self) -> None:
        assert self.woken == self.done
        assert set(self.state.data) == self.present

    @invariant()
    def no_stale_registrations(self) -> None:
        registered = {w for waiters in self.state._waiters.values() for w in waiters}
        assert registered == set(self.outstanding)
        assert all(self.state._waiters.values())


TestWaiterMachine = WaiterMachine.TestCase
TestWaiterMachine.settings = configured(
    max_examples=100, stateful_step_count=40, suppress_health_check=[HealthCheck.too_slow]
)


def test_a_request_arriving_in_pieces_is_never_rescanned(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = tuple(b"key%06d" % i for i in range(5_000))
    frame = Wait(keys).encode()
    parser = RequestParser()
    parser.feed(Validate().encode())
    assert isinstance(next(parser), Validate)
    reads = 0
    real_check = RequestParser._check_blob  # called on every length prefix read

    def counting_check(self: RequestParser, *args: Any) -> None:
        nonlocal reads
        reads += 1
        real_check(self, *args)

    monkeypatch.setattr(RequestParser, "_check_blob", counting_check)
    pieces = range(0, len(frame), 64)
    parsed: list[Request] = []
    for offset in pieces:
        parser.feed(frame[offset : offset + 64])
        parsed.extend(parser)
    assert parsed == [Wait(keys)]
    # Each key is read once, plus at most one unfinished attempt per piece.
    assert reads <= len(keys) + len(pieces)
