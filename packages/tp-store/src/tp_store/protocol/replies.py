"""Reply formats: how each reply is laid out, for the server to encode and the client to decode.

Replies carry no type on the wire: the request decides. Each request class
names its :class:`ReplyFormat` beside its own layout (see
:mod:`tp_store.protocol.messages`), so the server encodes a value and the client
decodes it with the same object, and the client gets a typed value back.
:class:`ReplyParser` is the untyped, queue-driven reader for raw clients
(tests, tools), driven by :class:`ReplyKind`.
"""

from __future__ import annotations

import enum
import struct
from collections import deque
from collections.abc import Callable, Sequence
from typing import ClassVar, Final, Generic, TypeVar

from tp_store.errors import ProtocolError

from .limits import Limits

_T = TypeVar("_T")

U8: Final = struct.Struct("<B")
U32: Final = struct.Struct("<I")
I64: Final = struct.Struct("<q")
U64: Final = struct.Struct("<Q")
# The struct methods the clients' whole replies are read with, looked up once.
_unpack_i64: Final = I64.unpack_from
_unpack_u64: Final = U64.unpack_from


class WaitReply(enum.IntEnum):
    """The one-byte replies to WAIT, WAIT_GET, BARRIER and CANCEL_WAIT."""

    STOP_WAITING = 0
    WAIT_CANCELED = 1


_STOP_WAITING: Final = int(WaitReply.STOP_WAITING)


class CheckReply(enum.IntEnum):
    """The one-byte reply to CHECK."""

    READY = 0
    NOT_READY = 1


class NeedMoreData(Exception):
    """The buffer ends inside the current message."""


def blob_field(data: bytes) -> bytes:
    """A byte string as the wire has it: its ``u64`` length, then its bytes."""
    return U64.pack(len(data)) + data


def blob_fields(items: Sequence[bytes]) -> bytes:
    """Byte strings back to back, each as :func:`blob_field`."""
    pack = U64.pack
    return b"".join([pack(len(item)) + item for item in items])


class ReplyReader:
    """Reads reply fields from the front of a buffer, refusing a length over the
    limits from its prefix: a server must not make the client buffer more than
    any store could send."""

    __slots__ = ("buf", "end", "limits", "pos")

    def __init__(self, buf: bytes | bytearray, limits: Limits) -> None:
        self.buf = buf
        self.pos = 0
        self.end = len(buf)
        self.limits = limits

    def take(self, size: int) -> int:
        """The offset of the next ``size`` bytes (``NeedMoreData`` if they have not come)."""
        start = self.pos
        if start + size > self.end:
            if start + size > self.limits.max_message_bytes:
                raise ProtocolError(
                    f"a reply of at least {start + size} bytes exceeds the limit of "
                    f"{self.limits.max_message_bytes}"
                )
            raise NeedMoreData
        self.pos = start + size
        return start

    def u8(self) -> int:
        return self.buf[self.take(1)]

    def i64(self) -> int:
        value: int = I64.unpack_from(self.buf, self.take(8))[0]
        return value

    def blob(self) -> bytes:
        size: int = U64.unpack_from(self.buf, self.take(8))[0]
        if size > self.limits.max_value_bytes:
            raise ProtocolError(
                f"a reply value of {size} bytes exceeds the limit of {self.limits.max_value_bytes}"
            )
        start = self.take(size)
        return bytes(self.buf[start : start + size])

    def blobs(self, count: int) -> list[bytes]:
        return [self.blob() for _ in range(count)]


class ReplyFormat(Generic[_T]):
    """The layout of one kind of reply, carrying values of type ``_T``.

    ``count`` is what the request announced (how many values a MULTI_GET or
    WAIT_GET reply holds); other formats ignore it. :attr:`pack` is
    :meth:`encode` as the fastest callable there is (a struct's own ``pack``
    for the fixed-size formats): what the server calls per reply.
    """

    __slots__ = ("pack",)

    def __init__(self) -> None:
        self.pack: Callable[[_T], bytes] = self.encode

    #: The fewest bytes a reply in this format has.
    min_size: ClassVar[int] = 0

    def encode(self, value: _T) -> bytes:
        """``value`` as the server sends it."""
        raise NotImplementedError

    def decode(self, reader: ReplyReader, count: int) -> _T:
        """The value at the reader (``NeedMoreData`` if incomplete, ``ProtocolError`` if bad)."""
        raise NotImplementedError

    def whole(self, data: bytearray, size: int, count: int, limits: Limits) -> _T | Incomplete:
        """The value when ``data[:size]`` is exactly one valid reply, else :data:`INCOMPLETE`.

        A client's every reply arrives so, as a rule: this reads it without a
        reader or a buffer. Anything else (part of a reply, more than one, a
        bad value) is :data:`INCOMPLETE` here, for :class:`ReplyBuffer` to read
        or refuse. Formats without this path always answer :data:`INCOMPLETE`.
        """
        return INCOMPLETE

    def status(self, value: _T) -> int:
        """The :class:`WaitReply` a blocking request's reply starts with."""
        raise ProtocolError(f"{type(self).__name__} is not the reply of a blocking request")


class NoReply(ReplyFormat[None]):
    """Requests the server never answers (SET, APPEND, MULTI_SET, QUEUE_PUSH, VALIDATE)."""

    __slots__ = ()
    min_size: ClassVar[int] = 0

    def encode(self, value: None) -> bytes:
        return b""

    def decode(self, reader: ReplyReader, count: int) -> None:
        raise ProtocolError("a reply arrived for a request that has none")


_U8_REPLIES: Final = (b"\x00", b"\x01")


class FlagReply(ReplyFormat[int]):
    """One byte, 0 or 1: :class:`WaitReply` or :class:`CheckReply`."""

    __slots__ = ()
    min_size: ClassVar[int] = 1

    def encode(self, value: int) -> bytes:
        return _U8_REPLIES[value]  # constant replies, encoded once

    def decode(self, reader: ReplyReader, count: int) -> int:
        value = reader.u8()
        if value > 1:
            raise ProtocolError(f"one-byte reply must be 0 or 1, got {value}")
        return value

    def whole(self, data: bytearray, size: int, count: int, limits: Limits) -> int | Incomplete:
        return data[0] if size == 1 and data[0] <= 1 else INCOMPLETE

    def status(self, value: int) -> int:
        return value


class NonceReply(ReplyFormat[int]):
    """A ``u32``: the PING reply."""

    __slots__ = ()
    min_size: ClassVar[int] = 4

    def __init__(self) -> None:
        super().__init__()
        self.pack = U32.pack

    def encode(self, value: int) -> bytes:
        return U32.pack(value)

    def decode(self, reader: ReplyReader, count: int) -> int:
        value: int = U32.unpack_from(reader.buf, reader.take(4))[0]
        return value


class NumberReply(ReplyFormat[int]):
    """An ``i64``: ADD, GETNUMKEYS, DELETE_KEY and QUEUE_LEN replies."""

    __slots__ = ()
    min_size: ClassVar[int] = 8

    def __init__(self) -> None:
        super().__init__()
        self.pack = I64.pack

    def encode(self, value: int) -> bytes:
        return I64.pack(value)

    def decode(self, reader: ReplyReader, count: int) -> int:
        return reader.i64()

    def whole(self, data: bytearray, size: int, count: int, limits: Limits) -> int | Incomplete:
        if size != 8:
            return INCOMPLETE
        value: int = _unpack_i64(data)[0]
        return value


class BytesReply(ReplyFormat[bytes]):
    """A byte string: GET, COMPARE_SET, STATS and the authentication replies."""

    __slots__ = ()
    min_size: ClassVar[int] = 8

    def encode(self, value: bytes) -> bytes:
        return U64.pack(len(value)) + value

    def decode(self, reader: ReplyReader, count: int) -> bytes:
        return reader.blob()

    def whole(self, data: bytearray, size: int, count: int, limits: Limits) -> bytes | Incomplete:
        if size < 8 or size - 8 != _unpack_u64(data)[0] or size - 8 > limits.max_value_bytes:
            return INCOMPLETE
        return bytes(data[8:size])


class ValuesReply(ReplyFormat[list[bytes]]):
    """MULTI_GET: the values back to back, their count known to the client."""

    __slots__ = ()
    min_size: ClassVar[int] = 0

    def encode(self, value: list[bytes]) -> bytes:
        return blob_fields(value)

    def decode(self, reader: ReplyReader, count: int) -> list[bytes]:
        return reader.blobs(count)


class KeyListReply(ReplyFormat[list[bytes]]):
    """LIST_KEYS: an ``i64`` count, then the keys."""

    __slots__ = ()
    min_size: ClassVar[int] = 8

    def encode(self, value: list[bytes]) -> bytes:
        return I64.pack(len(value)) + blob_fields(value)

    def decode(self, reader: ReplyReader, count: int) -> list[bytes]:
        n = reader.i64()
        if n < 0:
            raise ProtocolError(f"LIST_KEYS count must not be negative, got {n}")
        return reader.blobs(n)


#: A QUEUE_POP reply: the queue's length before the pop, and the value (None if it was empty).
Popped = tuple[int, "bytes | None"]


class QueuePopReply(ReplyFormat[Popped]):
    """QUEUE_POP: the length before the pop, then the value if there was one."""

    __slots__ = ()
    min_size: ClassVar[int] = 8

    def encode(self, value: Popped) -> bytes:
        length, popped = value
        return I64.pack(length) if popped is None else I64.pack(length) + blob_field(popped)

    def decode(self, reader: ReplyReader, count: int) -> Popped:
        length = reader.i64()
        if length < 0:
            raise ProtocolError(f"QUEUE_POP length must not be negative, got {length}")
        return (length, reader.blob() if length > 0 else None)


#: A WAIT_GET reply: STOP_WAITING and the values, or WAIT_CANCELED and None.
Waited = tuple[int, "list[bytes] | None"]


class WaitGetReply(ReplyFormat[Waited]):
    """WAIT_GET: STOP_WAITING then ``count`` values once every key exists (or WAIT_CANCELED)."""

    __slots__ = ()
    min_size: ClassVar[int] = 1

    def encode(self, value: Waited) -> bytes:
        status, values = value
        if values is None:
            return _U8_REPLIES[status]
        if len(values) == 1:  # a get
            return b"".join((b"\x00", U64.pack(len(values[0])), values[0]))
        return b"\x00" + blob_fields(values)

    def decode(self, reader: ReplyReader, count: int) -> Waited:
        status = reader.u8()
        if status == WaitReply.STOP_WAITING:
            return (status, [reader.blob()] if count == 1 else reader.blobs(count))
        if status == WaitReply.WAIT_CANCELED:
            return (status, None)
        raise ProtocolError(f"WAIT_GET reply must start with 0 or 1, got {status}")

    def whole(self, data: bytearray, size: int, count: int, limits: Limits) -> Waited | Incomplete:
        # A get's reply (one value); a MULTI_GET's takes the general way.
        if (
            count != 1
            or size < 9
            or data[0] != _STOP_WAITING
            or size - 9 != _unpack_u64(data, 1)[0]
            or size - 9 > limits.max_value_bytes
        ):
            return INCOMPLETE
        return (_STOP_WAITING, [bytes(data[9:size])])

    def status(self, value: Waited) -> int:
        return value[0]


NO_REPLY: Final = NoReply()
FLAG_REPLY: Final = FlagReply()
NONCE_REPLY: Final = NonceReply()
NUMBER_REPLY: Final = NumberReply()
BYTES_REPLY: Final = BytesReply()
VALUES_REPLY: Final = ValuesReply()
KEY_LIST_REPLY: Final = KeyListReply()
QUEUE_POP_REPLY: Final = QueuePopReply()
WAIT_GET_REPLY: Final = WaitGetReply()


# The encoders of each reply format, by name (raw servers and tests use them).


def encode_u8(value: int) -> bytes:
    """A one-byte reply (:class:`WaitReply`, :class:`CheckReply`)."""
    return FLAG_REPLY.encode(value)


def encode_u32(value: int) -> bytes:
    """The PING reply."""
    return NONCE_REPLY.encode(value)


def encode_i64(value: int) -> bytes:
    """ADD, GETNUMKEYS, DELETE_KEY and QUEUE_LEN replies."""
    return NUMBER_REPLY.encode(value)


def encode_bytes(value: bytes) -> bytes:
    """GET and COMPARE_SET replies."""
    return BYTES_REPLY.encode(value)


def encode_values(values: list[bytes]) -> bytes:
    """MULTI_GET reply: the values back to back, the count known to the client."""
    return VALUES_REPLY.encode(values)


def encode_key_list(keys: list[bytes]) -> bytes:
    """LIST_KEYS reply: an ``i64`` count, then the keys."""
    return KEY_LIST_REPLY.encode(keys)


def encode_queue_pop(length: int, value: bytes | None) -> bytes:
    """QUEUE_POP reply: the length before the pop, then the value if there was one."""
    return QUEUE_POP_REPLY.encode((length, value))


def encode_wait_get(values: list[bytes]) -> bytes:
    """WAIT_GET reply once every key exists: STOP_WAITING, then the values."""
    return WAIT_GET_REPLY.encode((WaitReply.STOP_WAITING, values))


class ReplyKind(enum.Enum):
    """The reply formats by name, for raw clients that read replies untyped."""

    U8 = FLAG_REPLY
    U32 = NONCE_REPLY
    I64 = NUMBER_REPLY
    BYTES = BYTES_REPLY
    VALUES = VALUES_REPLY  # MULTI_GET: ``count`` values
    KEY_LIST = KEY_LIST_REPLY
    QUEUE_POP = QUEUE_POP_REPLY
    WAIT_GET = WAIT_GET_REPLY  # u8; after STOP_WAITING, ``count`` values


#: A reply value as :class:`ReplyParser` returns it.
Reply = int | bytes | list[bytes] | tuple[int, list[bytes] | bytes | None]


class Incomplete(enum.Enum):
    """The type of :data:`INCOMPLETE`: no whole reply has arrived yet."""

    INCOMPLETE = "INCOMPLETE"

    def __repr__(self) -> str:
        return "INCOMPLETE"


#: Returned by the parsers until a whole reply has arrived.
INCOMPLETE: Final = Incomplete.INCOMPLETE


class ReplyBuffer:
    """Bytes from a server, read one reply at a time in the format the caller names.

    The client's half of the framing: it knows the request it sent, so it
    names the reply's format (see :class:`ReplyParser` for the queue-driven
    form). A value over ``limits.max_value_bytes`` or a reply over
    ``limits.max_message_bytes`` raises :class:`ProtocolError` as soon as its
    length arrives.
    """

    __slots__ = ("limits", "pending")

    def __init__(self, limits: Limits | None = None) -> None:
        #: What a reply may hold.
        self.limits = limits or Limits()
        #: Bytes received and not yet read as a reply (not to be changed but by the
        #: methods here); empty as a rule between replies.
        self.pending: bytes | bytearray = b""

    @property
    def buffered(self) -> int:
        """Bytes received and not yet read as a reply."""
        return len(self.pending)

    def feed(self, data: bytes) -> None:
        """Add bytes received from the server."""
        buf = self.pending
        if not buf:
            self.pending = data  # the common case: kept as is, not copied
        elif isinstance(buf, bytearray):
            buf += data
        else:
            self.pending = bytearray(buf) + data

    def clear(self) -> None:
        """Forget what is buffered (after a connection is lost)."""
        self.pending = b""

    def received(self, data: bytes, reply: ReplyFormat[_T], count: int = 0) -> _T | Incomplete:
        """:meth:`feed` ``data``, then :meth:`read`."""
        self.feed(data)
        return self.read(reply, count)

    def read(self, reply: ReplyFormat[_T], count: int = 0) -> _T | Incomplete:
        """The next reply in ``reply``'s format, or :data:`INCOMPLETE`."""
        buf = self.pending
        if len(buf) < reply.min_size:
            return INCOMPLETE
        reader = ReplyReader(buf, self.limits)
        try:
            decoded = reply.decode(reader, count)
        except NeedMoreData:
            return INCOMPLETE
        self._consume(reader.pos)
        return decoded

    def _consume(self, size: int) -> None:
        buf = self.pending
        if size == len(buf):
            self.pending = b""
        elif isinstance(buf, bytearray):
            del buf[:size]
        else:
            self.pending = buf[size:]


class ReplyParser:
    """Turns a byte stream from a server into replies, in the order expected.

    The client announces what it expects with :meth:`expect` before (or
    after) feeding bytes; limits as in :class:`ReplyBuffer`.
    """

    def __init__(self, limits: Limits | None = None) -> None:
        self._replies = ReplyBuffer(limits)
        self._expected: deque[tuple[ReplyKind, int]] = deque()

    def expect(self, kind: ReplyKind, count: int = 0) -> None:
        """Queue the kind of the next reply (``count`` values for VALUES/WAIT_GET)."""
        self._expected.append((kind, count))

    def feed(self, data: bytes) -> None:
        """Add bytes received from the server."""
        self._replies.feed(data)

    def clear(self) -> None:
        """Forget buffered bytes and expectations (after a connection is lost)."""
        self._replies.clear()
        self._expected.clear()

    def next_reply(self) -> Reply | Incomplete:
        """The next whole reply, or :data:`INCOMPLETE`.

        Raises :class:`ProtocolError` if bytes arrive that no request asked for
        or a one-byte reply has a value the protocol does not define.
        """
        if not self._expected:
            if self._replies.buffered:
                raise ProtocolError(
                    f"{self._replies.buffered} bytes arrived that no request asked for"
                )
            return INCOMPLETE
        kind, count = self._expected[0]
        reply: Reply | Incomplete = self._replies.read(kind.value, count)
        if reply is not INCOMPLETE:
            self._expected.popleft()
        return reply
