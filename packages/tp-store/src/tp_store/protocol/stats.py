"""The STATS extension: the server's counters as a versioned JSON document."""

from __future__ import annotations

import json
import math
from typing import Final, TypedDict, cast

from tp_store.errors import ProtocolError

from .replies import blob_field

#: The version of the :class:`ServerStats` document. Adding a field keeps it;
#: changing or removing one bumps it, and clients refuse a version they do not know.
STATS_SCHEMA: Final = 1


class SessionStats(TypedDict, total=False):
    """The store-session counters of a :class:`ServerStats` (absent from servers
    older than the store-session extension)."""

    #: Store sessions open now.
    sessions_open: int
    #: Store sessions opened in total.
    sessions_opened: int
    #: Store sessions ended by SESSION_CLOSE, in total.
    sessions_ended_closed: int
    #: Store sessions ended because their connection closed, in total.
    sessions_ended_disconnected: int
    #: Store sessions ended because nothing arrived on their connection for their timeout.
    sessions_ended_expired: int


class ServerStats(SessionStats):
    """A store server's counters, as ``STATS`` returns them (a JSON object on the wire).

    Totals count from the server's start; the others are the values now.
    """

    #: :data:`STATS_SCHEMA` of the server that wrote the document.
    schema: int
    #: The server's tp-store version.
    tp_store_version: str
    #: Seconds since the server started listening.
    uptime_seconds: float
    #: Client connections open now.
    connections_open: int
    #: Client connections accepted in total.
    connections_accepted: int
    #: Connections the server closed because of a protocol error (malformed or
    #: out-of-order request, over a limit, ADD on a non-integer).
    connections_protocol_errors: int
    #: Connections closed as soon as accepted: ``max_connections`` were open.
    connections_refused: int
    #: Connections closed because a request (or the handshake, or the
    #: authentication) did not arrive whole within the request timeout.
    connections_timed_out: int
    #: Connections closed for a wrong proof of the secret, or for a request
    #: sent before authenticating to a server that has a secret.
    connections_auth_failures: int
    #: Connections parked now in WAIT, WAIT_GET or BARRIER.
    waiters_parked: int
    #: Keys stored now (what GETNUMKEYS answers).
    keys: int
    #: Bytes received from clients in total.
    bytes_received: int
    #: Bytes of replies sent to clients in total.
    bytes_sent: int
    #: Requests received in total, by lower-case opcode name (every opcode, zeros included).
    ops: dict[str, int]


#: The fields of :class:`ServerStats` that are counts (non-negative ints).
_STATS_COUNTS: Final = (
    "connections_open",
    "connections_accepted",
    "connections_protocol_errors",
    "connections_refused",
    "connections_timed_out",
    "connections_auth_failures",
    "waiters_parked",
    "keys",
    "bytes_received",
    "bytes_sent",
)
#: The counts of :class:`SessionStats`, checked when present.
_SESSION_COUNTS: Final = tuple(SessionStats.__annotations__)


def stats_document(stats: ServerStats) -> bytes:
    """The counters as a compact JSON document (the STATS reply's byte string)."""
    return json.dumps(stats, separators=(",", ":"), allow_nan=False).encode()


def encode_stats(stats: ServerStats) -> bytes:
    """STATS reply: :func:`stats_document`, sent as a byte string."""
    return blob_field(stats_document(stats))


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def decode_stats(document: bytes) -> ServerStats:
    """The :class:`ServerStats` in a STATS reply's bytes, checked field by field.

    Fields a newer server adds are kept. Raises :class:`ProtocolError` naming
    the first thing wrong: not JSON, not an object, an unknown schema, a field
    missing or of the wrong type.
    """
    try:
        stats = json.loads(document)
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, or absurd nesting
        raise ProtocolError(f"statistics are not a JSON document: {exc}") from exc
    if not isinstance(stats, dict):
        raise ProtocolError(f"statistics must be a JSON object, got {type(stats).__name__}")
    schema = stats.get("schema")
    if not _is_count(schema) or schema != STATS_SCHEMA:
        raise ProtocolError(f"statistics schema {schema!r} is not the known {STATS_SCHEMA}")
    for name in _STATS_COUNTS:
        value = stats.get(name)
        if not _is_count(value):
            raise ProtocolError(f"statistics field {name!r} must be a count, got {value!r}")
    for name in _SESSION_COUNTS:
        value = stats.get(name, 0)
        if not _is_count(value):
            raise ProtocolError(f"statistics field {name!r} must be a count, got {value!r}")
    uptime = stats.get("uptime_seconds")
    if not (isinstance(uptime, (int, float)) and not isinstance(uptime, bool)):
        raise ProtocolError(f"statistics field 'uptime_seconds' must be a number, got {uptime!r}")
    if not 0 <= uptime < math.inf:
        raise ProtocolError(f"statistics field 'uptime_seconds' out of range: {uptime!r}")
    if not isinstance(stats.get("tp_store_version"), str):
        raise ProtocolError(
            f"statistics field 'tp_store_version' must be a string, "
            f"got {stats.get('tp_store_version')!r}"
        )
    ops = stats.get("ops")
    if not isinstance(ops, dict) or not all(_is_count(count) for count in ops.values()):
        raise ProtocolError(f"statistics field 'ops' must map names to counts, got {ops!r:.200}")
    return cast(ServerStats, stats)
