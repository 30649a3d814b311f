"""The TCPStore wire protocol as a sans-IO codec.

Requests and replies are typed values; bytes go in and out, no sockets. A
:class:`RequestParser` (server side) and a :class:`ReplyParser` (client side)
accept a byte stream split anywhere. Malformed input raises
:class:`~tp_store.errors.ProtocolError` and nothing else.

The framing is PyTorch's (see ``tcpstore-wire-protocol.md``): an opcode byte,
then fields; integers little-endian; byte strings as a ``u64`` length and the
raw bytes. Our own client and server also understand one extension opcode,
``WAIT_GET``, negotiated through the handshake PING so that a PyTorch peer
never sees it.
"""

from __future__ import annotations

import enum
import struct
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, Final

from .errors import ProtocolError

#: The magic number a client sends in VALIDATE.
VALIDATE_MAGIC: Final = 0x3C85F7CE

#: A PING nonce no PyTorch client can send (its nonce is a pid, below 2**22):
#: our client offers the protocol extensions with it.
EXTENSION_OFFER: Final = 0x54505801
#: What our server answers to :data:`EXTENSION_OFFER`. A PyTorch server
#: echoes the nonce instead, which tells our client to speak plain PyTorch.
EXTENSION_ACCEPT: Final = 0x54505802

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_OP_U64 = struct.Struct("<BQ")
_OP_U32 = struct.Struct("<BI")


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
    """Field limits a server enforces (PyTorch's libuv server has the same defaults)."""

    max_key_bytes: int = 8 * 1024
    max_value_bytes: int = 8 * 1024 * 1024
    max_keys_per_request: int = 128 * 1024

    def __post_init__(self) -> None:
        for name in ("max_key_bytes", "max_value_bytes", "max_keys_per_request"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")


# ---------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------


def _field(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


def _fields(items: Sequence[bytes]) -> bytes:
    return b"".join([_U64.pack(len(item)) + item for item in items])


@dataclass(frozen=True)
class Validate:
    """First message of every connection."""

    opcode: ClassVar[Opcode] = Opcode.VALIDATE
    magic: int = VALIDATE_MAGIC

    def encode(self) -> bytes:
        return _OP_U32.pack(self.opcode, self.magic)


@dataclass(frozen=True)
class Set:
    opcode: ClassVar[Opcode] = Opcode.SET
    key: bytes
    value: bytes

    def encode(self) -> bytes:
        return b"\x01" + _field(self.key) + _field(self.value)


@dataclass(frozen=True)
class CompareSet:
    opcode: ClassVar[Opcode] = Opcode.COMPARE_SET
    key: bytes
    expected: bytes
    desired: bytes

    def encode(self) -> bytes:
        return b"\x02" + _field(self.key) + _field(self.expected) + _field(self.desired)


@dataclass(frozen=True)
class Get:
    opcode: ClassVar[Opcode] = Opcode.GET
    key: bytes

    def encode(self) -> bytes:
        return b"\x03" + _field(self.key)


@dataclass(frozen=True)
class Add:
    opcode: ClassVar[Opcode] = Opcode.ADD
    key: bytes
    delta: int

    def encode(self) -> bytes:
        return b"\x04" + _field(self.key) + _I64.pack(self.delta)


@dataclass(frozen=True)
class Check:
    opcode: ClassVar[Opcode] = Opcode.CHECK
    keys: tuple[bytes, ...]

    def encode(self) -> bytes:
        return _OP_U64.pack(self.opcode, len(self.keys)) + _fields(self.keys)


@dataclass(frozen=True)
class Wait:
    opcode: ClassVar[Opcode] = Opcode.WAIT
    keys: tuple[bytes, ...]

    def encode(self) -> bytes:
        return _OP_U64.pack(self.opcode, len(self.keys)) + _fields(self.keys)


@dataclass(frozen=True)
class GetNumKeys:
    opcode: ClassVar[Opcode] = Opcode.GETNUMKEYS

    def encode(self) -> bytes:
        return b"\x07"


@dataclass(frozen=True)
class DeleteKey:
    opcode: ClassVar[Opcode] = Opcode.DELETE_KEY
    key: bytes

    def encode(self) -> bytes:
        return b"\x08" + _field(self.key)


@dataclass(frozen=True)
class Append:
    opcode: ClassVar[Opcode] = Opcode.APPEND
    key: bytes
    value: bytes

    def encode(self) -> bytes:
        return b"\x09" + _field(self.key) + _field(self.value)


@dataclass(frozen=True)
class MultiGet:
    opcode: ClassVar[Opcode] = Opcode.MULTI_GET
    keys: tuple[bytes, ...]

    def encode(self) -> bytes:
        return _OP_U64.pack(self.opcode, len(self.keys)) + _fields(self.keys)


@dataclass(frozen=True)
class MultiSet:
    opcode: ClassVar[Opcode] = Opcode.MULTI_SET
    items: tuple[tuple[bytes, bytes], ...]

    def encode(self) -> bytes:
        body = b"".join([_field(key) + _field(value) for key, value in self.items])
        return b"\x0b" + _I64.pack(len(self.items)) + body


@dataclass(frozen=True)
class CancelWait:
    opcode: ClassVar[Opcode] = Opcode.CANCEL_WAIT

    def encode(self) -> bytes:
        return b"\x0c"


@dataclass(frozen=True)
class Ping:
    opcode: ClassVar[Opcode] = Opcode.PING
    nonce: int

    def encode(self) -> bytes:
        return _OP_U32.pack(self.opcode, self.nonce)


@dataclass(frozen=True)
class QueuePush:
    opcode: ClassVar[Opcode] = Opcode.QUEUE_PUSH
    key: bytes
    value: bytes

    def encode(self) -> bytes:
        return b"\x0e" + _field(self.key) + _field(self.value)


@dataclass(frozen=True)
class QueuePop:
    opcode: ClassVar[Opcode] = Opcode.QUEUE_POP
    key: bytes

    def encode(self) -> bytes:
        return b"\x0f" + _field(self.key)


@dataclass(frozen=True)
class QueueLen:
    opcode: ClassVar[Opcode] = Opcode.QUEUE_LEN
    key: bytes

    def encode(self) -> bytes:
        return b"\x10" + _field(self.key)


@dataclass(frozen=True)
class ListKeys:
    opcode: ClassVar[Opcode] = Opcode.LIST_KEYS

    def encode(self) -> bytes:
        return b"\x11"


@dataclass(frozen=True)
class Barrier:
    opcode: ClassVar[Opcode] = Opcode.BARRIER
    key: bytes
    world_size: int

    def encode(self) -> bytes:
        return b"\x12" + _field(self.key) + _I64.pack(self.world_size)


@dataclass(frozen=True)
class WaitGet:
    """Extension: WAIT then MULTI_GET in one round trip."""

    opcode: ClassVar[Opcode] = Opcode.WAIT_GET
    keys: tuple[bytes, ...]

    def encode(self) -> bytes:
        return _OP_U64.pack(self.opcode, len(self.keys)) + _fields(self.keys)


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
)


# ---------------------------------------------------------------------------
# Request parsing (server side)
# ---------------------------------------------------------------------------


class _NeedMoreData(Exception):
    """The buffer ends inside the current message."""


class _Cursor:
    """Reads fields from a buffer, raising _NeedMoreData when it runs out."""

    __slots__ = ("buf", "end", "limits", "pos")

    def __init__(self, buf: bytearray, pos: int, limits: Limits) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf)
        self.limits = limits

    def _take(self, size: int) -> int:
        start = self.pos
        if start + size > self.end:
            raise _NeedMoreData
        self.pos = start + size
        return start

    def u32(self) -> int:
        value: int = _U32.unpack_from(self.buf, self._take(4))[0]
        return value

    def i64(self) -> int:
        value: int = _I64.unpack_from(self.buf, self._take(8))[0]
        return value

    def count(self, signed: bool = False) -> int:
        start = self._take(8)
        value: int = (_I64 if signed else _U64).unpack_from(self.buf, start)[0]
        if value < 0 or value > self.limits.max_keys_per_request:
            raise ProtocolError(f"key count {value} outside 0..{self.limits.max_keys_per_request}")
        return value

    def _blob(self, limit: int, what: str) -> bytes:
        size: int = _U64.unpack_from(self.buf, self._take(8))[0]
        if size > limit:
            raise ProtocolError(f"{what} of {size} bytes exceeds the limit of {limit}")
        start = self._take(size)
        return bytes(self.buf[start : start + size])

    def key(self) -> bytes:
        return self._blob(self.limits.max_key_bytes, "key")

    def value(self) -> bytes:
        return self._blob(self.limits.max_value_bytes, "value")

    def keys(self) -> tuple[bytes, ...]:
        return tuple([self.key() for _ in range(self.count())])


def _parse_body(opcode: int, cur: _Cursor) -> Request:
    if opcode == Opcode.GET:
        return Get(cur.key())
    if opcode == Opcode.ADD:
        return Add(cur.key(), cur.i64())
    if opcode == Opcode.SET:
        return Set(cur.key(), cur.value())
    if opcode == Opcode.WAIT_GET:
        return WaitGet(cur.keys())
    if opcode == Opcode.COMPARE_SET:
        return CompareSet(cur.key(), cur.value(), cur.value())
    if opcode == Opcode.WAIT:
        return Wait(cur.keys())
    if opcode == Opcode.CHECK:
        return Check(cur.keys())
    if opcode == Opcode.MULTI_GET:
        return MultiGet(cur.keys())
    if opcode == Opcode.MULTI_SET:
        n = cur.count(signed=True)
        return MultiSet(tuple([(cur.key(), cur.value()) for _ in range(n)]))
    if opcode == Opcode.APPEND:
        return Append(cur.key(), cur.value())
    if opcode == Opcode.DELETE_KEY:
        return DeleteKey(cur.key())
    if opcode == Opcode.GETNUMKEYS:
        return GetNumKeys()
    if opcode == Opcode.CANCEL_WAIT:
        return CancelWait()
    if opcode == Opcode.PING:
        return Ping(cur.u32())
    if opcode == Opcode.QUEUE_PUSH:
        return QueuePush(cur.key(), cur.value())
    if opcode == Opcode.QUEUE_POP:
        return QueuePop(cur.key())
    if opcode == Opcode.QUEUE_LEN:
        return QueueLen(cur.key())
    if opcode == Opcode.LIST_KEYS:
        return ListKeys()
    if opcode == Opcode.BARRIER:
        return Barrier(cur.key(), cur.i64())
    if opcode == Opcode.VALIDATE:
        return Validate(cur.u32())
    raise ProtocolError(f"unknown opcode {opcode}")


class RequestParser:
    """Turns a byte stream from one client into requests.

    The first request must be a VALIDATE with the right magic, as PyTorch's
    servers require. Any violation raises :class:`ProtocolError`; the caller
    should then drop the connection.
    """

    def __init__(self, limits: Limits | None = None) -> None:
        self._limits = limits or Limits()
        self._buf = bytearray()
        self._validated = False

    def feed(self, data: bytes) -> None:
        """Add bytes received from the client."""
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes received but not yet parsed into a request."""
        return len(self._buf)

    def __iter__(self) -> Iterator[Request]:
        return self

    def __next__(self) -> Request:
        buf = self._buf
        if not buf:
            raise StopIteration
        cur = _Cursor(buf, 1, self._limits)
        try:
            request = _parse_body(buf[0], cur)
        except _NeedMoreData:
            raise StopIteration from None
        del buf[: cur.pos]
        if not self._validated:
            if not isinstance(request, Validate) or request.magic != VALIDATE_MAGIC:
                raise ProtocolError(f"first message must be VALIDATE, got {request!r:.80}")
            self._validated = True
        return request


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
    """Reads reply fields (no limits: the client trusts sizes it asked for)."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytearray) -> None:
        self.buf = buf
        self.pos = 0
        self.end = len(buf)

    def take(self, size: int) -> int:
        start = self.pos
        if start + size > self.end:
            raise _NeedMoreData
        self.pos = start + size
        return start

    def u8(self) -> int:
        return self.buf[self.take(1)]

    def u32(self) -> int:
        value: int = _U32.unpack_from(self.buf, self.take(4))[0]
        return value

    def i64(self) -> int:
        value: int = _I64.unpack_from(self.buf, self.take(8))[0]
        return value

    def blob(self) -> bytes:
        size: int = _U64.unpack_from(self.buf, self.take(8))[0]
        start = self.take(size)
        return bytes(self.buf[start : start + size])

    def blobs(self, count: int) -> list[bytes]:
        return [self.blob() for _ in range(count)]


class ReplyParser:
    """Turns a byte stream from a server into replies, in the order expected.

    The protocol's replies are untyped, so the client announces what it
    expects with :meth:`expect` before (or after) feeding bytes.
    """

    def __init__(self) -> None:
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
        kind, count = self._expected[0]
        cur = _ReplyCursor(self._buf)
        try:
            reply = self._parse(kind, count, cur)
        except _NeedMoreData:
            return INCOMPLETE
        del self._buf[: cur.pos]
        self._expected.popleft()
        return reply

    @staticmethod
    def _parse(kind: ReplyKind, count: int, cur: _ReplyCursor) -> Reply:
        if kind is ReplyKind.I64:
            return cur.i64()
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
        if kind is ReplyKind.U32:
            return cur.u32()
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
