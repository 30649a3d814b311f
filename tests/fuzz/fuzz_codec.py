"""Fuzz the sans-IO wire codec of ``tp_store`` (no sockets, no server).

What must hold for any input, fed in any chunking:

- :class:`~tp_store.protocol.RequestParser` raises nothing but
  :class:`~tp_store.errors.ProtocolError`; it never yields more requests than
  it was fed bytes (every request takes at least one), so it cannot loop; and
  once drained it holds at most one incomplete request, never more than
  ``max_message_bytes`` (+16 bytes of a count and a length prefix that are
  read before the size check applies), whatever the chunk sizes;
- the chunking changes nothing: the requests and whether an error comes are
  those of the whole stream fed at once;
- a valid stream parses back to exactly the requests encoded;
- :class:`~tp_store.protocol.ReplyParser` raises nothing but
  ``ProtocolError`` and returns no more replies than were expected.

Inputs: arbitrary bytes (with and without a valid VALIDATE first), and valid
request streams (built from the codec's own layout table, so every opcode is
covered, extensions included) mutated by bit flips, truncation, insertions,
deletions, splices, hostile length prefixes and random opcodes.

Three ways to run it:

- ``pytest tests/fuzz/test_fuzz_codec.py``: a brief run (CI);
- ``python tests/fuzz/fuzz_codec.py --examples 200000 --seconds 600``:
  hypothesis at length, in seeded batches, printing the figures;
- ``python tests/fuzz/fuzz_codec.py --atheris [libFuzzer options]``: coverage-
  guided, where the ``atheris`` package installs (optional).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import struct
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

try:
    import tp_store
except ImportError:  # run from a checkout without installing: use the monorepo's source
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "packages" / "tp-store" / "src"))
    import tp_store

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from tp_store import protocol
from tp_store.errors import ProtocolError
from tp_store.protocol import (
    INCOMPLETE,
    VALIDATE_MAGIC,
    Limits,
    ReplyKind,
    ReplyParser,
    Request,
    RequestParser,
    Validate,
)

assert tp_store  # imported for its path fallback above

#: Limits small enough that fuzzed streams hit them all the time.
SMALL_LIMITS = Limits(
    max_key_bytes=64,
    max_value_bytes=256,
    max_keys_per_request=8,
    max_message_bytes=1024,
)
DEFAULT_LIMITS = Limits()
#: What the parser may hold past ``max_message_bytes`` after a drain: a count
#: (8 bytes) and a partial length prefix (< 8) are read before the next size
#: check; see RequestParser._group and _blob.
SLACK = 16
_U64 = struct.Struct("<Q")
#: Lengths and counts a corrupted prefix takes: huge, at and around the limits, small.
HOSTILE_SIZES = (
    2**64 - 1,
    2**63,
    2**63 - 1,
    2**32,
    2**31,
    8 * 1024 * 1024 + 1,
    128 * 1024 + 1,
    1025,
    1024,
    257,
    65,
    64,
    9,
    1,
    0,
)
VALIDATE_FRAME = Validate(VALIDATE_MAGIC).encode()


@dataclasses.dataclass
class Figures:
    """What a fuzz run fed the codec and what came out."""

    examples: int = 0
    bytes_fed: int = 0
    chunks_fed: int = 0
    requests_parsed: int = 0
    protocol_errors: int = 0
    replies_parsed: int = 0
    #: Property runs that found anything but ProtocolError or a broken invariant: must be 0.
    crashes: int = 0
    peak_buffered: int = 0
    slowest_example_s: float = 0.0
    elapsed_s: float = 0.0
    failures: list[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        """The figures as an aligned table."""
        rows = [
            ("examples", self.examples),
            ("bytes fed", self.bytes_fed),
            ("chunks fed", self.chunks_fed),
            ("requests parsed", self.requests_parsed),
            ("replies parsed", self.replies_parsed),
            ("protocol errors (expected)", self.protocol_errors),
            ("crashes", self.crashes),
            ("peak bytes buffered after a drain", self.peak_buffered),
            ("slowest example", f"{self.slowest_example_s * 1000:.1f} ms"),
            ("elapsed", f"{self.elapsed_s:.1f} s"),
        ]
        width = max(len(name) for name, _ in rows)
        lines = [f"{name:<{width}}  {value}" for name, value in rows]
        return "\n".join(lines + [f"  failure: {text}" for text in self.failures[:10]])


#: The figures of this process's runs (the CLI and the tests read them).
FIGURES = Figures()


# ---------------------------------------------------------------------------
# Feeding the parsers
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ParseResult:
    """The requests a stream gave, and whether (and where) it was refused."""

    requests: tuple[Request, ...]
    refused: bool
    bytes_consumed: int


def chunked(data: bytes, sizes: Sequence[int]) -> list[bytes]:
    """``data`` cut into pieces of ``sizes`` (cycled; a 0 is taken as 1)."""
    pieces: list[bytes] = []
    position, turn = 0, 0
    sizes = list(sizes) or [len(data) or 1]
    while position < len(data):
        size = max(1, sizes[turn % len(sizes)])
        pieces.append(data[position : position + size])
        position += size
        turn += 1
    return pieces


def parse_requests(pieces: Sequence[bytes], limits: Limits) -> ParseResult:
    """Feed ``pieces`` one by one, draining after each; check the invariants.

    Raises ``AssertionError`` when an invariant breaks; anything but
    ``ProtocolError`` from the parser propagates.
    """
    parser = RequestParser(limits)
    bound = limits.max_message_bytes + SLACK
    requests: list[Request] = []
    fed = 0
    for piece in pieces:
        parser.feed(piece)
        fed += len(piece)
        FIGURES.chunks_fed += 1
        FIGURES.bytes_fed += len(piece)
        try:
            for request in parser:
                requests.append(request)
                # Every request is at least its opcode byte: more requests
                # than bytes would be a parser looping on its buffer.
                assert len(requests) <= fed, f"{len(requests)} requests from {fed} bytes"
        except ProtocolError:
            FIGURES.protocol_errors += 1
            FIGURES.requests_parsed += len(requests)
            return ParseResult(tuple(requests), True, fed)
        buffered = parser.buffered
        FIGURES.peak_buffered = max(FIGURES.peak_buffered, buffered)
        assert buffered <= bound, f"{buffered} bytes buffered after a drain; the bound is {bound}"
        assert buffered <= fed
    FIGURES.requests_parsed += len(requests)
    return ParseResult(tuple(requests), False, fed)


def check_stream(data: bytes, sizes: Sequence[int], limits: Limits) -> ParseResult:
    """Parse ``data`` whole and in the chunking ``sizes``; both must agree."""
    whole = parse_requests([data] if data else [], limits)
    pieces = parse_requests(chunked(data, sizes), limits)
    assert pieces.requests == whole.requests, "the chunking changed the requests parsed"
    assert pieces.refused == whole.refused, "the chunking changed whether the stream is refused"
    return pieces


def parse_replies(expected: Sequence[tuple[ReplyKind, int]], pieces: Sequence[bytes]) -> int:
    """Feed ``pieces`` to a ReplyParser expecting ``expected``; the replies it returned."""
    parser = ReplyParser()
    for kind, count in expected:
        parser.expect(kind, count)
    replies = 0
    try:
        for piece in pieces:
            parser.feed(piece)
            FIGURES.bytes_fed += len(piece)
            FIGURES.chunks_fed += 1
            while parser.next_reply() is not INCOMPLETE:
                replies += 1
                assert replies <= len(expected), "more replies than were expected"
    except ProtocolError:
        FIGURES.protocol_errors += 1
    FIGURES.replies_parsed += replies
    return replies


# ---------------------------------------------------------------------------
# Strategies: requests from the codec's own layout table, then mutations
# ---------------------------------------------------------------------------

_LAYOUTS: dict[int, tuple[type[Request], tuple[Any, ...]]] = protocol.LAYOUTS
_Field = protocol.Field


def _key(limit: int) -> st.SearchStrategy[bytes]:
    # Mostly short keys; now and then one right at the limit.
    return st.binary(max_size=16) | st.binary(min_size=max(limit - 2, 0), max_size=limit)


def _field(kind: Any, limits: Limits) -> st.SearchStrategy[Any]:
    key = _key(min(limits.max_key_bytes, 64))
    value = st.binary(max_size=32) | st.binary(
        min_size=0, max_size=min(limits.max_value_bytes, 300)
    )
    if kind is _Field.U32:
        return st.integers(0, 2**32 - 1)
    if kind is _Field.I64:
        return st.integers(-(2**63), 2**63 - 1)
    if kind is _Field.KEY:
        return key
    if kind is _Field.VALUE:
        return value
    count = min(limits.max_keys_per_request, 4)
    if kind is _Field.KEYS:
        return st.lists(key, max_size=count).map(tuple)
    return st.lists(st.tuples(key, value), max_size=2).map(tuple)


def requests(limits: Limits = DEFAULT_LIMITS) -> st.SearchStrategy[Request]:
    """Any request the codec knows, with fields drawn to respect ``limits`` mostly."""

    def build(request_type: type[Request], layout: tuple[Any, ...]) -> st.SearchStrategy[Request]:
        fields = st.tuples(*(_field(kind, limits) for kind in layout))
        return fields.map(lambda values: request_type(*values))

    return st.one_of([build(request_type, layout) for request_type, layout in _LAYOUTS.values()])


def valid_streams(limits: Limits = DEFAULT_LIMITS) -> st.SearchStrategy[list[Request]]:
    """A VALIDATE, then requests."""
    return st.lists(requests(limits), max_size=12).map(
        lambda rest: [Validate(VALIDATE_MAGIC), *rest]
    )


def _mutate(data: bytearray, draw: Callable[..., Any]) -> None:
    """One mutation of ``data`` in place, chosen by ``draw``."""
    where = draw(st.integers(0, max(len(data) - 1, 0)))
    how = draw(
        st.sampled_from(
            ("flip", "truncate", "insert", "delete", "splice", "length", "opcode", "dup")
        )
    )
    if how == "flip" and data:
        data[where] ^= draw(st.integers(1, 255))
    elif how == "truncate":
        del data[where:]
    elif how == "insert":
        data[where:where] = draw(st.binary(min_size=1, max_size=16))
    elif how == "delete":
        del data[where : where + draw(st.integers(1, 16))]
    elif how == "splice" and data:
        start = draw(st.integers(0, len(data) - 1))
        data[where:where] = data[start : start + draw(st.integers(1, 64))]
    elif how == "length":
        size = draw(st.sampled_from(HOSTILE_SIZES) | st.integers(0, 2**64 - 1))
        data[where : where + 8] = _U64.pack(size)
    elif how == "opcode" and data:
        data[where] = draw(st.integers(0, 255))
    elif how == "dup":
        data += data[: draw(st.integers(0, 64))]


@st.composite
def mutated_streams(draw: Callable[..., Any], limits: Limits = DEFAULT_LIMITS) -> bytes:
    """A valid request stream with 0 to 5 mutations."""
    data = bytearray(b"".join(request.encode() for request in draw(valid_streams(limits))))
    for _ in range(draw(st.integers(0, 5))):
        _mutate(data, draw)
    return bytes(data)


def chunk_sizes() -> st.SearchStrategy[list[int]]:
    """Chunk sizes, cycled over a stream: byte by byte, small, large, mixed."""
    return st.lists(st.integers(1, 64) | st.integers(1, 4096), min_size=1, max_size=8)


def _arbitrary_bytes() -> st.SearchStrategy[bytes]:
    # Past the VALIDATE check half the time, so the rest of the parser is reached.
    return st.tuples(st.booleans(), st.binary(max_size=2048)).map(
        lambda pair: (VALIDATE_FRAME if pair[0] else b"") + pair[1]
    )


LIMITS = st.sampled_from((SMALL_LIMITS, DEFAULT_LIMITS))
REPLY_EXPECTATIONS = st.lists(
    st.tuples(st.sampled_from(list(ReplyKind)), st.integers(0, 6)), min_size=1, max_size=6
)


# ---------------------------------------------------------------------------
# The properties (plain functions: the tests and the CLI wrap them in given)
# ---------------------------------------------------------------------------


def _timed(body: Callable[[], object]) -> None:
    started = time.perf_counter()
    try:
        body()
    finally:
        FIGURES.examples += 1
        FIGURES.slowest_example_s = max(FIGURES.slowest_example_s, time.perf_counter() - started)


def prop_arbitrary_bytes(data: bytes, sizes: list[int], limits: Limits) -> None:
    """Arbitrary bytes: only ProtocolError, bounded buffer, chunking-invariant."""
    _timed(lambda: check_stream(data, sizes, limits))


def prop_mutated_streams(data: bytes, sizes: list[int], limits: Limits) -> None:
    """Mutated valid streams: the same, deeper in the parser."""
    _timed(lambda: check_stream(data, sizes, limits))


def prop_valid_streams(stream: list[Request], sizes: list[int]) -> None:
    """A valid stream parses back to exactly what was encoded, in any chunking."""

    def body() -> None:
        data = b"".join(request.encode() for request in stream)
        result = check_stream(data, sizes, DEFAULT_LIMITS)
        assert not result.refused, "a valid stream was refused"
        assert list(result.requests) == stream, "a valid stream parsed to other requests"

    _timed(body)


def prop_replies(expected: list[tuple[ReplyKind, int]], data: bytes, sizes: list[int]) -> None:
    """Replies: only ProtocolError, never more replies than expected."""

    def body() -> None:
        parse_replies(expected, chunked(data, sizes))

    _timed(body)


def _given_all(examples: int, batch_seed: int | None) -> list[Callable[[], None]]:
    """The four properties as hypothesis tests of ``examples`` examples each."""
    config = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=batch_seed is None,
        suppress_health_check=list(HealthCheck),
    )
    tests: list[Callable[[], None]] = [
        given(_arbitrary_bytes(), chunk_sizes(), LIMITS)(prop_arbitrary_bytes),
        given(mutated_streams(SMALL_LIMITS) | mutated_streams(), chunk_sizes(), LIMITS)(
            prop_mutated_streams
        ),
        given(valid_streams(), chunk_sizes())(prop_valid_streams),
        given(REPLY_EXPECTATIONS, st.binary(max_size=512), chunk_sizes())(prop_replies),
    ]
    wrapped = [config(test) for test in tests]
    if batch_seed is not None:
        wrapped = [seed(batch_seed)(test) for test in wrapped]
    return wrapped


def run_hypothesis(examples: int, seconds: float, first_seed: int) -> Figures:
    """Run every property in seeded batches until ``examples`` or ``seconds`` is reached."""
    started = time.monotonic()
    # Small batches: the time budget is checked between them.
    batch = min(max(examples // 4, 1), 500)
    batch_seed = first_seed
    while FIGURES.examples < examples and time.monotonic() - started < seconds:
        for test in _given_all(batch, batch_seed):
            try:
                test()
            except Exception as exc:  # a broken property: counted, reported, the run stops
                FIGURES.crashes += 1
                FIGURES.failures.append(f"seed {batch_seed}: {type(exc).__name__}: {exc}"[:2000])
        if FIGURES.crashes:
            break
        batch_seed += 1
    FIGURES.elapsed_s = time.monotonic() - started
    return FIGURES


# ---------------------------------------------------------------------------
# atheris (coverage-guided), where it installs
# ---------------------------------------------------------------------------


def atheris_one_input(data: bytes) -> None:
    """One libFuzzer input: a chunking and a limit choice, then the stream."""
    if len(data) < 2:
        return
    limits = SMALL_LIMITS if data[0] & 1 else DEFAULT_LIMITS
    sizes = [1 + (data[1] & 0x3F), 1 + (data[1] >> 6) * 500]
    stream = data[2:]
    if data[0] & 2:
        stream = VALIDATE_FRAME + stream
    check_stream(stream, sizes, limits)
    kinds = list(ReplyKind)
    parse_replies([(kinds[data[0] % len(kinds)], data[1] % 5)], chunked(data, sizes))


def run_atheris(argv: list[str]) -> int:
    """Hand control to libFuzzer (returns only if atheris is missing)."""
    try:
        import atheris  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        print(
            "atheris is not installed (python3 -m pip install atheris; it needs a "
            "wheel or clang with libFuzzer for this Python)",
            file=sys.stderr,
        )
        return 2
    # The codec is already imported (by this module): instrument what is loaded.
    atheris.instrument_all()
    atheris.Setup([sys.argv[0], *argv], atheris_one_input)
    atheris.Fuzz()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: hypothesis at length, or atheris."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=20_000, help="examples in all")
    parser.add_argument("--seconds", type=float, default=600.0, help="stop after this long")
    parser.add_argument("--seed", type=int, default=1, help="seed of the first batch")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--atheris", action="store_true", help="run atheris; the other arguments go to libFuzzer"
    )
    args, rest = parser.parse_known_args(argv)
    if args.atheris:
        return run_atheris(rest)
    if rest:
        parser.error(f"unknown arguments {rest}")
    figures = run_hypothesis(args.examples, args.seconds, args.seed)
    if args.json:
        print(json.dumps(dataclasses.asdict(figures), indent=2))
    else:
        print(figures.summary())
    return 0 if figures.crashes == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
