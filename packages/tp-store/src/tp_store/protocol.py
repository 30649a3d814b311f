"""The TCPStore wire protocol as a sans-IO codec.

Requests and replies are typed values; bytes go in and out, no sockets. A
:class:`RequestParser` (server side) and a :class:`ReplyParser` (client side)
accept a byte stream split anywhere. Malformed input raises
:class:`~tp_store.errors.ProtocolError` and nothing else.

The framing is PyTorch's (see ``tcpstore-wire-protocol.md``): an opcode byte,
then fields; integers little-endian; byte strings as a ``u64`` length and the
raw bytes. Our own client and server also understand extension opcodes
(``WAIT_GET``, ``STATS`` and the authentication exchange ``AUTH_CHALLENGE``
and ``AUTH_PROOF``), negotiated through the handshake PING so that a PyTorch
peer never sees them.

Authentication is a shared-secret challenge-response that never puts the
secret on the wire (see :class:`ClientAuthenticator` and
:class:`ServerAuthenticator`)::

    client -> AUTH_CHALLENGE(client_nonce)      32 random bytes
    server -> server_nonce                      32 random bytes; empty: no secret here
    client -> AUTH_PROOF(HMAC(secret, "client", server_nonce, client_nonce))
    server -> HMAC(secret, "server", server_nonce, client_nonce)
              or empty bytes and the connection closed when the proof is wrong

Both sides prove they know the secret: the server's proof lets the client
refuse a server that merely accepts everything.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import math
import os
import struct
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Final, TypedDict, cast

from .errors import ProtocolError, StoreAuthenticationError

#: The magic number a client sends in VALIDATE.
VALIDATE_MAGIC: Final = 0x3C85F7CE

#: A PING nonce no PyTorch client can send (its nonce is a pid, below 2**22):
#: our client offers the protocol extensions with it.
EXTENSION_OFFER: Final = 0x54505801
#: What our server answers to :data:`EXTENSION_OFFER`. A PyTorch server
#: echoes the nonce instead, which tells our client to speak plain PyTorch.
EXTENSION_ACCEPT: Final = 0x54505802
#: What our server answers to :data:`EXTENSION_OFFER` when it has a secret:
#: the extensions are accepted, and nothing else will be until the client
#: authenticates (so a client without a secret can say so at once).
EXTENSION_ACCEPT_AUTH: Final = 0x54505803
#: What our server sends, unasked, on a connection it refuses because
#: ``max_connections`` are open, right before closing it. Our client reads it
#: where it awaits the answer to its handshake PING, and can say why it was
#: turned away; a PyTorch client reads it as a wrong PING answer and retries,
#: as it does when a refused connection is just closed.
CONNECTION_REFUSED: Final = 0x54505804

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")


class Opcode(enum.IntEnum):
    """Request opcodes (PyTorch's numbering, plus our extension)."""

    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13
    QUEUE_PUSH = 14
    QUEUE_POP = 15
    QUEUE_LEN = 16
    LIST_KEYS = 17
    BARRIER = 18
    #: Extension: wait for all keys, then reply STOP_WAITING and their values.
    WAIT_GET = 0xE0
    #: Extension: the server's counters, as a JSON document (see :class:`ServerStats`).
    STATS = 0xE1
    #: Extension: start authenticating; the client's nonce in, the server's out.
    AUTH_CHALLENGE = 0xE2
    #: Extension: the client's proof of the secret in, the server's proof out.
    AUTH_PROOF = 0xE3


class WaitReply(enum.IntEnum):
    """The one-byte replies to WAIT, WAIT_GET, BARRIER and CANCEL_WAIT."""

    STOP_WAITING = 0
    WAIT_CANCELED = 1


class CheckReply(enum.IntEnum):
    """The one-byte reply to CHECK."""

    READY = 0
    NOT_READY = 1


@dataclass(frozen=True)
class Limits:
    """The limits a server enforces on requests and on what it stores.

    The first three are PyTorch's libuv server's. The others bound memory:
    ``max_keys`` counts keys and queued values together (a request that would
    store one more closes its connection), and ``max_message_bytes`` bounds
    one request and one reply (a MULTI_GET of a big value a million times
    would otherwise build its reply in memory). ``max_value_bytes`` also
    bounds what APPEND grows a value to.
    """

    max_key_bytes: int = 8 * 1024
    max_value_bytes: int = 8 * 1024 * 1024
    max_keys_per_request: int = 128 * 1024
    max_keys: int = 1_000_000
    max_message_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Limits.{field.name} must be a positive int, got {value!r}")
        # A SET of the biggest key and value must fit in one message.
        smallest = 1 + 16 + self.max_key_bytes + self.max_value_bytes
        if self.max_message_bytes < smallest:
            raise ValueError(
                f"Limits.max_message_bytes must be at least {smallest} (a SET of the biggest "
                f"key and value), got {self.max_message_bytes}"
            )


# ---------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------


def _field(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


def _fields(items: Sequence[bytes]) -> bytes:
    return b"".join([_U64.pack(len(item)) + item for item in items])


class Message:
    """Base of every request: it knows its opcode and encodes itself by its layout."""

    __slots__ = ()
    opcode: ClassVar[Opcode]

    def encode(self) -> bytes:
        """The request as bytes on the wire."""
        return encode_request(self)


@dataclass(frozen=True)
class Validate(Message):
    """First message of every connection."""

    opcode: ClassVar[Opcode] = Opcode.VALIDATE
    magic: int = VALIDATE_MAGIC


@dataclass(frozen=True)
class Set(Message):
    opcode: ClassVar[Opcode] = Opcode.SET
    key: bytes
    value: bytes


@dataclass(frozen=True)
class CompareSet(Message):
    opcode: ClassVar[Opcode] = Opcode.COMPARE_SET
    key: bytes
    expected: bytes
    desired: bytes


@dataclass(frozen=True)
class Get(Message):
    opcode: ClassVar[Opcode] = Opcode.GET
    key: bytes


@dataclass(frozen=True)
class Add(Message):
    opcode: ClassVar[Opcode] = Opcode.ADD
    key: bytes
    delta: int


@dataclass(frozen=True)
class Check(Message):
    opcode: ClassVar[Opcode] = Opcode.CHECK
    keys: tuple[bytes, ...]


@dataclass(frozen=True)
class Wait(Message):
    opcode: ClassVar[Opcode] = Opcode.WAIT
    keys: tuple[bytes, ...]


@dataclass(frozen=True)
class GetNumKeys(Message):
    opcode: ClassVar[Opcode] = Opcode.GETNUMKEYS


@dataclass(frozen=True)
class DeleteKey(Message):
    opcode: ClassVar[Opcode] = Opcode.DELETE_KEY
    key: bytes


@dataclass(frozen=True)
class Append(Message):
    opcode: ClassVar[Opcode] = Opcode.APPEND
    key: bytes
    value: bytes


@dataclass(frozen=True)
class MultiGet(Message):
    opcode: ClassVar[Opcode] = Opcode.MULTI_GET
    keys: tuple[bytes, ...]


@dataclass(frozen=True)
class MultiSet(Message):
    opcode: ClassVar[Opcode] = Opcode.MULTI_SET
    items: tuple[tuple[bytes, bytes], ...]


@dataclass(frozen=True)
class CancelWait(Message):
    opcode: ClassVar[Opcode] = Opcode.CANCEL_WAIT


@dataclass(frozen=True)
class Ping(Message):
    opcode: ClassVar[Opcode] = Opcode.PING
    nonce: int


@dataclass(frozen=True)
class QueuePush(Message):
    opcode: ClassVar[Opcode] = Opcode.QUEUE_PUSH
    key: bytes
    value: bytes


@dataclass(frozen=True)
class QueuePop(Message):
    opcode: ClassVar[Opcode] = Opcode.QUEUE_POP
    key: bytes


@dataclass(frozen=True)
class QueueLen(Message):
    opcode: ClassVar[Opcode] = Opcode.QUEUE_LEN
    key: bytes


@dataclass(frozen=True)
class ListKeys(Message):
    opcode: ClassVar[Opcode] = Opcode.LIST_KEYS


@dataclass(frozen=True)
class Barrier(Message):
    opcode: ClassVar[Opcode] = Opcode.BARRIER
    key: bytes
    world_size: int


@dataclass(frozen=True)
class WaitGet(Message):
    """Extension: WAIT then MULTI_GET in one round trip."""

    opcode: ClassVar[Opcode] = Opcode.WAIT_GET
    keys: tuple[bytes, ...]


@dataclass(frozen=True)
class Stats(Message):
    """Extension: ask for the server's counters (answered with :func:`encode_stats`)."""

    opcode: ClassVar[Opcode] = Opcode.STATS


@dataclass(frozen=True)
class AuthChallenge(Message):
    """Extension: the client's nonce; answered with the server's (empty: no secret)."""

    opcode: ClassVar[Opcode] = Opcode.AUTH_CHALLENGE
    nonce: bytes


@dataclass(frozen=True)
class AuthProof(Message):
    """Extension: the client's proof; answered with the server's (empty: refused)."""

    opcode: ClassVar[Opcode] = Opcode.AUTH_PROOF
    proof: bytes


Request = (
    Validate
    | Set
    | CompareSet
    | Get
    | Add
    | Check
    | Wait
    | GetNumKeys
    | DeleteKey
    | Append
    | MultiGet
    | MultiSet
    | CancelWait
    | Ping
    | QueuePush
    | QueuePop
    | QueueLen
    | ListKeys
    | Barrier
    | WaitGet
    | Stats
    | AuthChallenge
    | AuthProof
)


# ---------------------------------------------------------------------------
# Request parsing (server side)
# ---------------------------------------------------------------------------


class _NeedMoreData(Exception):
    """The buffer ends inside the current message."""


class _Field(enum.Enum):
    """The field types of requests, in wire order."""

    U32 = enum.auto()
    I64 = enum.auto()
    KEY = enum.auto()
    VALUE = enum.auto()
    KEYS = enum.auto()  # u64 count, then that many keys
    ITEMS = enum.auto()  # i64 count, then that many (key, value) pairs


#: Each opcode's request type and fields: the one description both the
#: parser and the encoders (``encode`` methods) follow.
_LAYOUTS: dict[int, tuple[type[Request], tuple[_Field, ...]]] = {
    Opcode.VALIDATE: (Validate, (_Field.U32,)),
    Opcode.SET: (Set, (_Field.KEY, _Field.VALUE)),
    Opcode.COMPARE_SET: (CompareSet, (_Field.KEY, _Field.VALUE, _Field.VALUE)),
    Opcode.GET: (Get, (_Field.KEY,)),
    Opcode.ADD: (Add, (_Field.KEY, _Field.I64)),
    Opcode.CHECK: (Check, (_Field.KEYS,)),
    Opcode.WAIT: (Wait, (_Field.KEYS,)),
    Opcode.GETNUMKEYS: (GetNumKeys, ()),
    Opcode.DELETE_KEY: (DeleteKey, (_Field.KEY,)),
    Opcode.APPEND: (Append, (_Field.KEY, _Field.VALUE)),
    Opcode.MULTI_GET: (MultiGet, (_Field.KEYS,)),
    Opcode.MULTI_SET: (MultiSet, (_Field.ITEMS,)),
    Opcode.CANCEL_WAIT: (CancelWait, ()),
    Opcode.PING: (Ping, (_Field.U32,)),
    Opcode.QUEUE_PUSH: (QueuePush, (_Field.KEY, _Field.VALUE)),
    Opcode.QUEUE_POP: (QueuePop, (_Field.KEY,)),
    Opcode.QUEUE_LEN: (QueueLen, (_Field.KEY,)),
    Opcode.LIST_KEYS: (ListKeys, ()),
    Opcode.BARRIER: (Barrier, (_Field.KEY, _Field.I64)),
    Opcode.WAIT_GET: (WaitGet, (_Field.KEYS,)),
    Opcode.STATS: (Stats, ()),
    Opcode.AUTH_CHALLENGE: (AuthChallenge, (_Field.KEY,)),
    Opcode.AUTH_PROOF: (AuthProof, (_Field.KEY,)),
}


#: What a connection may send before it has authenticated to a server that
#: has a secret: the handshake and the authentication exchange, nothing else.
_BEFORE_AUTH_LAYOUTS: Final[dict[int, tuple[type[Request], tuple[_Field, ...]]]] = {
    opcode: _LAYOUTS[opcode]
    for opcode in (Opcode.VALIDATE, Opcode.PING, Opcode.AUTH_CHALLENGE, Opcode.AUTH_PROOF)
}
#: The size a request may have before authentication (its fields are a magic,
#: a nonce or a proof): refused from its header, so an unauthenticated peer
#: never makes the server buffer more.
BEFORE_AUTH_MESSAGE_BYTES: Final = 256


class RequestBeforeAuthentication(ProtocolError):
    """A request other than the handshake and authentication, sent before authenticating."""


def _encode_items(items: Sequence[tuple[bytes, bytes]]) -> bytes:
    return _I64.pack(len(items)) + b"".join([_field(k) + _field(v) for k, v in items])


_FIELD_ENCODERS: dict[_Field, Callable[[Any], bytes]] = {
    _Field.U32: _U32.pack,
    _Field.I64: _I64.pack,
    _Field.KEY: _field,
    _Field.VALUE: _field,
    _Field.KEYS: lambda keys: _U64.pack(len(keys)) + _fields(keys),
    _Field.ITEMS: _encode_items,
}

#: Per request type: its opcode byte, and an encoder for each field in wire order.
_ENCODERS: dict[type[Message], tuple[bytes, tuple[tuple[str, Callable[[Any], bytes]], ...]]] = {
    request_type: (
        bytes((opcode,)),
        tuple(
            (field.name, _FIELD_ENCODERS[kind])
            for field, kind in zip(fields(request_type), layout, strict=True)
        ),
    )
    for opcode, (request_type, layout) in _LAYOUTS.items()
}


def encode_request(request: Message) -> bytes:
    """``request`` as bytes on the wire: its opcode, then its fields as its layout says."""
    opcode, encoders = _ENCODERS[type(request)]
    return opcode + b"".join([encode(getattr(request, name)) for name, encode in encoders])


class _Progress:
    """How far the parser got into the request at the front of the buffer.

    Kept across :meth:`RequestParser.feed` calls, so a request that arrives in
    many pieces is parsed once, never rescanned from its first byte.
    """

    __slots__ = ("fields", "group", "index", "layout", "pos", "remaining", "request_type")

    def __init__(self, request_type: type[Request], layout: tuple[_Field, ...]) -> None:
        self.request_type = request_type
        self.layout = layout
        self.index = 0  # the next field of layout
        self.pos = 1  # the next unread byte, just past the opcode
        # Typed by the layout table, which matches each request's constructor.
        self.fields: list[Any] = []
        self.group: list[bytes] = []  # keys, or keys and values alternately
        self.remaining = -1  # entries of the group still to read; -1 before its count


class RequestParser:
    """Turns a byte stream from one client into requests.

    The first request must be a VALIDATE with the right magic, as PyTorch's
    servers require. Any violation raises :class:`ProtocolError` as soon as
    the offending bytes arrive (a length over a limit is refused from its
    prefix alone); the caller should then drop the connection.

    With ``authenticated=False`` only the handshake and authentication
    requests are accepted, each at most :data:`BEFORE_AUTH_MESSAGE_BYTES`,
    until :meth:`authenticated` is called: anything else raises
    :class:`RequestBeforeAuthentication` from its opcode byte.
    """

    def __init__(self, limits: Limits | None = None, *, authenticated: bool = True) -> None:
        self._limits = limits or Limits()
        self._buf = bytearray()
        self._validated = False
        self._progress: _Progress | None = None
        self._layouts: dict[int, tuple[type[Request], tuple[_Field, ...]]] = _LAYOUTS
        self._max_message = self._limits.max_message_bytes
        if not authenticated:
            self._layouts = _BEFORE_AUTH_LAYOUTS
            self._max_message = min(self._max_message, BEFORE_AUTH_MESSAGE_BYTES)

    def authenticated(self) -> None:
        """Accept every request from now on, within the limits."""
        self._layouts = _LAYOUTS
        self._max_message = self._limits.max_message_bytes

    def feed(self, data: bytes) -> None:
        """Add bytes received from the client."""
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as requests."""
        return len(self._buf)

    def __iter__(self) -> Iterator[Request]:
        return self

    def __next__(self) -> Request:
        progress = self._progress
        if progress is None:
            if not self._buf:
                raise StopIteration
            progress = self._progress = self._start(self._buf[0])
        try:
            self._advance(progress)
        except _NeedMoreData:
            raise StopIteration from None
        self._progress = None
        del self._buf[: progress.pos]
        request = progress.request_type(*progress.fields)
        if not self._validated:
            if not isinstance(request, Validate) or request.magic != VALIDATE_MAGIC:
                raise ProtocolError(f"first message must be VALIDATE, got {request!r:.80}")
            self._validated = True
        return request

    def _start(self, opcode: int) -> _Progress:
        layout = self._layouts.get(opcode)
        if layout is None:
            if opcode in _LAYOUTS:
                raise RequestBeforeAuthentication(
                    f"{Opcode(opcode).name} sent before authenticating"
                )
            raise ProtocolError(f"unknown opcode {opcode}")
        if not self._validated and opcode != Opcode.VALIDATE:
            raise ProtocolError(f"first message must be VALIDATE, got opcode {opcode}")
        return _Progress(*layout)

    def _advance(self, progress: _Progress) -> None:
        """Read whole fields until the request is complete (or raise _NeedMoreData)."""
        layout = progress.layout
        limits = self._limits
        while progress.index < len(layout):
            kind = layout[progress.index]
            if kind is _Field.KEY:
                progress.fields.append(self._blob(progress, limits.max_key_bytes, "key"))
            elif kind is _Field.VALUE:
                progress.fields.append(self._blob(progress, limits.max_value_bytes, "value"))
            elif kind is _Field.I64:
                progress.fields.append(self._number(progress, _I64))
            elif kind is _Field.U32:
                progress.fields.append(self._number(progress, _U32))
            else:
                progress.fields.append(self._group(progress, kind is _Field.ITEMS))
            progress.index += 1

    def _group(self, progress: _Progress, items: bool) -> tuple[object, ...]:
        limits = self._limits
        if progress.remaining < 0:
            count = self._number(progress, _I64 if items else _U64)
            if not 0 <= count <= limits.max_keys_per_request:
                raise ProtocolError(f"key count {count} outside 0..{limits.max_keys_per_request}")
            progress.remaining = 2 * count if items else count
        group = progress.group
        while progress.remaining:
            is_value = items and len(group) % 2 == 1
            if is_value:
                group.append(self._blob(progress, limits.max_value_bytes, "value"))
            else:
                group.append(self._blob(progress, limits.max_key_bytes, "key"))
            progress.remaining -= 1
        progress.group = []
        progress.remaining = -1
        if items:
            return tuple(zip(group[::2], group[1::2], strict=True))
        return tuple(group)

    def _number(self, progress: _Progress, kind: struct.Struct) -> int:
        start = progress.pos
        if start + kind.size > len(self._buf):
            raise _NeedMoreData
        value: int = kind.unpack_from(self._buf, start)[0]
        progress.pos = start + kind.size
        return value

    def _blob(self, progress: _Progress, limit: int, what: str) -> bytes:
        buf = self._buf
        start = progress.pos
        if start + 8 > len(buf):
            raise _NeedMoreData
        size: int = _U64.unpack_from(buf, start)[0]
        if size > limit:
            raise ProtocolError(f"{what} of {size} bytes exceeds the limit of {limit}")
        end = start + 8 + size
        # The buffer starts with this request, so ``end`` is its size so far:
        # refused from the length prefix, before the bytes are buffered.
        if end > self._max_message:
            raise ProtocolError(
                f"request of at least {end} bytes exceeds the limit of {self._max_message}"
            )
        if end > len(buf):
            raise _NeedMoreData
        progress.pos = end
        return bytes(buf[start + 8 : end])


# ---------------------------------------------------------------------------
# Replies
# ---------------------------------------------------------------------------


def encode_u8(value: int) -> bytes:
    """A one-byte reply (WaitReply, CheckReply)."""
    return _U8.pack(value)


def encode_u32(value: int) -> bytes:
    """The PING reply."""
    return _U32.pack(value)


def encode_i64(value: int) -> bytes:
    """ADD, GETNUMKEYS, DELETE_KEY and QUEUE_LEN replies."""
    return _I64.pack(value)


def encode_bytes(value: bytes) -> bytes:
    """GET and COMPARE_SET replies."""
    return _field(value)


def encode_values(values: Sequence[bytes]) -> bytes:
    """MULTI_GET reply: the values back to back, the count known to the client."""
    return _fields(values)


def encode_key_list(keys: Sequence[bytes]) -> bytes:
    """LIST_KEYS reply: an ``i64`` count, then the keys."""
    return _I64.pack(len(keys)) + _fields(keys)


def encode_queue_pop(length: int, value: bytes | None) -> bytes:
    """QUEUE_POP reply: the length before the pop, then the value if there was one."""
    return _I64.pack(length) if value is None else _I64.pack(length) + _field(value)


def encode_wait_get(values: Sequence[bytes]) -> bytes:
    """WAIT_GET reply once every key exists: STOP_WAITING, then the values."""
    return b"\x00" + _fields(values)


# ---------------------------------------------------------------------------
# Server statistics (the STATS extension)
# ---------------------------------------------------------------------------

#: The version of the :class:`ServerStats` document. Adding a field keeps it;
#: changing or removing one bumps it, and clients refuse a version they do not know.
STATS_SCHEMA: Final = 1


class ServerStats(TypedDict):
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


def encode_stats(stats: ServerStats) -> bytes:
    """STATS reply: the counters as a compact JSON document, sent as a byte string."""
    return _field(json.dumps(stats, separators=(",", ":"), allow_nan=False).encode())


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


# ---------------------------------------------------------------------------
# Authentication (the AUTH_CHALLENGE and AUTH_PROOF extension)
# ---------------------------------------------------------------------------

#: Size of each side's nonce; fixed, so the MAC's input has one parse.
AUTH_NONCE_BYTES: Final = 32
#: Size of a proof (an HMAC-SHA256).
AUTH_PROOF_BYTES: Final = 32
# Binds a proof to this protocol and version: a MAC computed with the same
# secret for anything else can never pass for one.
_AUTH_CONTEXT: Final = b"tp-store auth v1\x00"
_CLIENT_ROLE: Final = b"client"
_SERVER_ROLE: Final = b"server"


def auth_proof(secret: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """HMAC-SHA256 of both nonces under ``secret``, for ``role`` (``b"client"`` or ``b"server"``).

    The role is part of the input so that the server's proof can never be
    replayed as the client's, nor the client's as the server's.
    """
    message = _AUTH_CONTEXT + role + server_nonce + client_nonce
    return hmac.new(secret, message, hashlib.sha256).digest()


#: The shortest secret accepted. One sniffed exchange lets an attacker test
#: guesses offline, so a secret must be long enough not to be guessed: 16
#: random bytes (``openssl rand -hex 16`` gives 32 characters) are plenty.
MIN_SECRET_BYTES: Final = 16


def check_secret(secret: bytes) -> bytes:
    """``secret`` if it can be used, else ``ValueError`` (never echoing the secret)."""
    if not isinstance(secret, bytes):
        raise TypeError(f"a store secret must be bytes, got {type(secret).__name__}")
    if not secret:
        raise ValueError("a store secret must not be empty")
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"a store secret must be at least {MIN_SECRET_BYTES} bytes, got {len(secret)}: "
            "a short one can be guessed offline from one sniffed authentication "
            "(make one with: openssl rand -hex 16)"
        )
    return secret


class ClientAuthenticator:
    """The client's side of the authentication exchange, without I/O.

    Send :meth:`challenge`, feed the server's answer to :meth:`prove` and send
    what it returns, then give the server's answer to :meth:`verify`. Every
    failure raises :class:`~tp_store.errors.StoreAuthenticationError`.
    """

    def __init__(self, secret: bytes, nonce: bytes | None = None) -> None:
        self._secret = check_secret(secret)
        self._nonce = os.urandom(AUTH_NONCE_BYTES) if nonce is None else nonce
        if len(self._nonce) != AUTH_NONCE_BYTES:
            raise ValueError(f"the client nonce must be {AUTH_NONCE_BYTES} bytes")
        self._server_nonce: bytes | None = None

    def challenge(self) -> AuthChallenge:
        """The first request: our nonce."""
        return AuthChallenge(self._nonce)

    def prove(self, server_nonce: bytes) -> AuthProof:
        """The second request, our proof, given the server's answer to the challenge."""
        if not server_nonce:
            raise StoreAuthenticationError(
                "the server has no secret configured but this client has one: "
                "refusing to continue unauthenticated"
            )
        if len(server_nonce) != AUTH_NONCE_BYTES:
            raise StoreAuthenticationError(
                f"the server's nonce is {len(server_nonce)} bytes, expected {AUTH_NONCE_BYTES}"
            )
        self._server_nonce = server_nonce
        return AuthProof(auth_proof(self._secret, _CLIENT_ROLE, server_nonce, self._nonce))

    def verify(self, server_proof: bytes) -> None:
        """Check the server's answer to our proof: it must prove the same secret."""
        if self._server_nonce is None:
            raise RuntimeError("verify() called before prove()")
        if not server_proof:
            raise StoreAuthenticationError(
                "the server refused our proof: the secrets differ (authentication failed)"
            )
        expected = auth_proof(self._secret, _SERVER_ROLE, self._server_nonce, self._nonce)
        if not hmac.compare_digest(server_proof, expected):
            raise StoreAuthenticationError(
                "the server could not prove it knows the secret (authentication failed)"
            )


class ServerAuthenticator:
    """The server's side of the authentication exchange for one connection, without I/O.

    With no secret, :meth:`challenge` answers empty bytes (so a client that
    has a secret fails loudly instead of carrying on unauthenticated).
    Requests out of order raise :class:`~tp_store.errors.ProtocolError`.
    """

    def __init__(self, secret: bytes | None, nonce: bytes | None = None) -> None:
        self._secret = None if secret is None else check_secret(secret)
        self._nonce = os.urandom(AUTH_NONCE_BYTES) if nonce is None else nonce
        self._client_nonce: bytes | None = None
        self._done = False

    def challenge(self, client_nonce: bytes) -> bytes:
        """The answer to AUTH_CHALLENGE: the server's nonce, or empty bytes if no secret."""
        if self._client_nonce is not None:
            raise ProtocolError("AUTH_CHALLENGE sent twice")
        if len(client_nonce) != AUTH_NONCE_BYTES:
            raise ProtocolError(
                f"AUTH_CHALLENGE nonce is {len(client_nonce)} bytes, expected {AUTH_NONCE_BYTES}"
            )
        self._client_nonce = client_nonce
        return b"" if self._secret is None else self._nonce

    def check(self, proof: bytes) -> bytes | None:
        """The answer to AUTH_PROOF: the server's proof if the client's is right, else None."""
        if self._client_nonce is None or self._secret is None or self._done:
            raise ProtocolError("AUTH_PROOF sent without a challenge to answer")
        self._done = True
        expected = auth_proof(self._secret, _CLIENT_ROLE, self._nonce, self._client_nonce)
        if not hmac.compare_digest(proof, expected):
            return None
        return auth_proof(self._secret, _SERVER_ROLE, self._nonce, self._client_nonce)


class ReplyKind(enum.Enum):
    """What the client expects next; replies carry no type of their own."""

    U8 = enum.auto()
    U32 = enum.auto()
    I64 = enum.auto()
    BYTES = enum.auto()
    VALUES = enum.auto()  # MULTI_GET: ``count`` values
    KEY_LIST = enum.auto()
    QUEUE_POP = enum.auto()
    WAIT_GET = enum.auto()  # u8; after STOP_WAITING, ``count`` values


#: A reply value as :class:`ReplyParser` returns it.
Reply = int | bytes | list[bytes] | tuple[int, list[bytes] | bytes | None]


class Incomplete:
    """The type of :data:`INCOMPLETE`: no whole reply has arrived yet."""

    def __repr__(self) -> str:
        return "INCOMPLETE"


#: Returned by :meth:`ReplyParser.next_reply` until a whole reply has arrived.
INCOMPLETE: Final = Incomplete()


class _ReplyCursor:
    """Reads reply fields, refusing a length over the limits from its prefix: a
    server must not make the client buffer more than any store could send."""

    __slots__ = ("buf", "end", "limits", "pos")

    def __init__(self, buf: bytearray, limits: Limits) -> None:
        self.buf = buf
        self.pos = 0
        self.end = len(buf)
        self.limits = limits

    def take(self, size: int) -> int:
        start = self.pos
        if start + size > self.end:
            if start + size > self.limits.max_message_bytes:
                raise ProtocolError(
                    f"a reply of at least {start + size} bytes exceeds the limit of "
                    f"{self.limits.max_message_bytes}"
                )
            raise _NeedMoreData
        self.pos = start + size
        return start

    def u8(self) -> int:
        return self.buf[self.take(1)]

    def i64(self) -> int:
        value: int = _I64.unpack_from(self.buf, self.take(8))[0]
        return value

    def blob(self) -> bytes:
        size: int = _U64.unpack_from(self.buf, self.take(8))[0]
        if size > self.limits.max_value_bytes:
            raise ProtocolError(
                f"a reply value of {size} bytes exceeds the limit of {self.limits.max_value_bytes}"
            )
        start = self.take(size)
        return bytes(self.buf[start : start + size])

    def blobs(self, count: int) -> list[bytes]:
        return [self.blob() for _ in range(count)]


#: Replies of one fixed-size integer, by kind.
_FIXED_SIZE_REPLIES: Final = {ReplyKind.I64: _I64, ReplyKind.U32: _U32}


class ReplyParser:
    """Turns a byte stream from a server into replies, in the order expected.

    The protocol's replies are untyped, so the client announces what it
    expects with :meth:`expect` before (or after) feeding bytes. A value over
    ``limits.max_value_bytes`` or a reply over ``limits.max_message_bytes``
    raises :class:`ProtocolError` as soon as its length arrives.
    """

    def __init__(self, limits: Limits | None = None) -> None:
        self._limits = limits or Limits()
        self._buf = bytearray()
        self._expected: deque[tuple[ReplyKind, int]] = deque()

    def expect(self, kind: ReplyKind, count: int = 0) -> None:
        """Queue the kind of the next reply (``count`` values for VALUES/WAIT_GET)."""
        self._expected.append((kind, count))

    def feed(self, data: bytes) -> None:
        """Add bytes received from the server."""
        self._buf += data

    def clear(self) -> None:
        """Forget buffered bytes and expectations (after a connection is lost)."""
        self._buf.clear()
        self._expected.clear()

    def next_reply(self) -> Reply | Incomplete:
        """The next whole reply, or :data:`INCOMPLETE`.

        Raises :class:`ProtocolError` if bytes arrive that no request asked for
        or a one-byte reply has a value the protocol does not define.
        """
        if not self._expected:
            if self._buf:
                raise ProtocolError(f"{len(self._buf)} bytes arrived that no request asked for")
            return INCOMPLETE
        buf = self._buf
        kind, count = self._expected[0]
        # One-integer replies (ADD, DELETE_KEY, counts, PING) are the hot path
        # of many clients: read them without a cursor.
        fixed = _FIXED_SIZE_REPLIES.get(kind)
        if fixed is not None:
            if len(buf) < fixed.size:
                return INCOMPLETE
            value: int = fixed.unpack_from(buf)[0]
            del buf[: fixed.size]
            self._expected.popleft()
            return value
        cur = _ReplyCursor(buf, self._limits)
        try:
            reply = self._parse(kind, count, cur)
        except _NeedMoreData:
            return INCOMPLETE
        del self._buf[: cur.pos]
        self._expected.popleft()
        return reply

    @staticmethod
    def _parse(kind: ReplyKind, count: int, cur: _ReplyCursor) -> Reply:
        if kind is ReplyKind.BYTES:
            return cur.blob()
        if kind is ReplyKind.U8:
            value = cur.u8()
            if value > 1:
                raise ProtocolError(f"one-byte reply must be 0 or 1, got {value}")
            return value
        if kind is ReplyKind.WAIT_GET:
            status = cur.u8()
            if status == WaitReply.STOP_WAITING:
                return (status, cur.blobs(count))
            if status == WaitReply.WAIT_CANCELED:
                return (status, None)
            raise ProtocolError(f"WAIT_GET reply must start with 0 or 1, got {status}")
        if kind is ReplyKind.VALUES:
            return cur.blobs(count)
        if kind is ReplyKind.KEY_LIST:
            n = cur.i64()
            if n < 0:
                raise ProtocolError(f"LIST_KEYS count must not be negative, got {n}")
            return cur.blobs(n)
        # QUEUE_POP
        length = cur.i64()
        if length < 0:
            raise ProtocolError(f"QUEUE_POP length must not be negative, got {length}")
        return (length, cur.blob() if length > 0 else None)
