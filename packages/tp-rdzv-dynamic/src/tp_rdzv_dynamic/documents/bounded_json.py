"""Reading the JSON documents nodes and the steward leave in the store, within bounds.

Anyone who can write to the store can put anything in the keys a rendezvous
reads, so every document is bounded before it is parsed: in size, in inflated
size when it is compressed (inflated step by step, never beyond the bound), in
the number of values (a few bytes of JSON can take 20 times their size parsed),
and in nesting depth (checked without recursion: Python's parser would raise
``RecursionError`` on 100,000 ``[``). A document over a bound, or not JSON, is a
:class:`DocumentError`, which readers turn into
:class:`~tp_rdzv_api.RendezvousStateError` or drop.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

from tp_store.protocol import Limits

#: The most a document may hold, inflated or not: the most a default store
#: holds in one value. The steward writes the state uncompressed, and every
#: other document (outcome, liveness report) names fewer nodes than it does.
MAX_DOCUMENT_BYTES = Limits().max_value_bytes
#: The most a mailbox message or the lease may hold (one node's name and a few numbers).
MAX_MESSAGE_BYTES = 64 << 10
#: No document nests deeper: the state is an object of lists of node entries (lists).
MAX_DEPTH = 3
#: The most memory the values of a document may take once parsed, estimated from
#: its tokens before parsing (:func:`_parsed_size`): what a document spells in 3
#: bytes (``{},``) takes 70 parsed. The estimate for a state is ~380 bytes a node
#: (30-character names): 32 MiB is ~85,000 nodes.
MAX_PARSED_BYTES = 32 << 20
#: The first byte of every zlib stream (0x78); JSON documents start with ``{``.
ZLIB_HEADER = b"x"

# Escaped backslashes and quotes go first (bytes.replace: no piece per escape,
# as re.sub makes), then strings hold no quote but their own: the pattern
# matches in one pass without backtracking (one pattern for strings with
# escapes in them takes quadratic time on '"' followed by many '\\"').
_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))
# An array or object holding no other (once all but brackets are gone): one
# level of nesting, removed per pass.
_INNERMOST = re.compile(rb"[\[{][\]}]")
_INFLATE_STEP = 1 << 20


class DocumentError(ValueError):
    """A document over a bound, or not JSON; the message says which (``"is not JSON..."``)."""


def load_document(raw: bytes, max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """The JSON value in ``raw`` (inflated first if zlib-compressed).

    Raises :class:`DocumentError` when ``raw``, or what it inflates to, holds
    more than ``max_bytes``, nests deeper than :data:`MAX_DEPTH`, or is not JSON.
    """
    if len(raw) > max_bytes:
        raise DocumentError(f"holds {len(raw)} bytes, more than the {max_bytes} allowed")
    if raw[:1] == ZLIB_HEADER:
        raw = _inflate(raw, max_bytes)
    problem = _structure_problem(raw, MAX_DEPTH)
    if problem is not None:
        raise DocumentError(problem)
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise DocumentError(f"is not JSON ({exc})") from exc


def _inflate(raw: bytes, max_bytes: int) -> bytes:
    """``raw`` inflated, one step at a time: never more than ``max_bytes`` (+ a step) in memory."""
    inflater = zlib.decompressobj()
    pieces: list[bytes] = []
    size = 0
    pending = raw
    try:
        while not inflater.eof:
            piece = inflater.decompress(pending, _INFLATE_STEP)
            pending = inflater.unconsumed_tail
            if not piece and not pending:
                raise DocumentError("is not valid zlib data (the stream is truncated)")
            size += len(piece)
            if size > max_bytes:
                raise DocumentError(f"inflates to more than {max_bytes} bytes")
            pieces.append(piece)
    except zlib.error as exc:
        raise DocumentError(f"is not valid zlib data ({exc})") from exc
    return b"".join(pieces)


def _structure_problem(raw: bytes, depth: int) -> str | None:
    """Why the structure of ``raw`` is refused, or None: more values than
    :data:`MAX_PARSED_BYTES` allows (:func:`_parsed_size`), nested deeper than
    ``depth``, or unpaired brackets.

    Strings go first (they may hold brackets; their escapes before them),
    then all but the brackets; each pass of a regular expression then removes
    the innermost pairs, so after ``depth`` passes nothing is left of a
    document that nests no deeper. Every step is one linear pass.
    """
    size = _parsed_size(raw)
    if size > MAX_PARSED_BYTES:
        return f"holds too many values (~{size >> 20} MiB parsed, {MAX_PARSED_BYTES >> 20} allowed)"
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = _STRING.sub(b"", unescaped).translate(None, _NOT_BRACKETS)
    for _ in range(depth):
        brackets, found = _INNERMOST.subn(b"", brackets)
        if not found:
            break
    if not brackets:
        return None
    if _INNERMOST.search(brackets):
        return f"nests deeper than {depth} levels"
    return "is not JSON (its brackets do not pair)"


def _parsed_size(raw: bytes) -> int:
    """An upper estimate of the memory that scanning and parsing ``raw`` take.

    Counted without allocating: per container (``[`` or ``{``), string (two
    quotes), other value (a separator) and escape, what CPython takes at most
    for a short one, the pieces the scans above cut out of it included. The
    characters of long strings take about what they took in the document.
    """
    containers = raw.count(b"[") + raw.count(b"{")
    values = raw.count(b",") + raw.count(b":") + 1
    return 100 * containers + 60 * raw.count(b'"') + 40 * values + 50 * raw.count(b"\\")
