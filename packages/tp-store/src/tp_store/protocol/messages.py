"""The requests of the TCPStore wire protocol: opcodes, layouts, reply formats.

Each request class is the one declaration of its message: its opcode, the
fields after it in wire order (``layout``, which the server's parser follows
and :meth:`Message.encode` writes), and the format of its reply (``reply``,
which the server encodes with and the client decodes with). The requests a
client sends on every call also have a ``frame`` that writes the same bytes
without building the object.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Final

from .replies import (
    BYTES_REPLY,
    FLAG_REPLY,
    I64,
    KEY_LIST_REPLY,
    NO_REPLY,
    NONCE_REPLY,
    NUMBER_REPLY,
    QUEUE_POP_REPLY,
    U32,
    U64,
    VALUES_REPLY,
    WAIT_GET_REPLY,
    BytesReply,
    FlagReply,
    KeyListReply,
    NonceReply,
    NoReply,
    NumberReply,
    QueuePopReply,
    ReplyFormat,
    ValuesReply,
    WaitGetReply,
    blob_field,
    blob_fields,
)

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
    #: Extension: open this connection's store session (timeout in ms); its id out.
    SESSION_OPEN = 0xE4
    #: Extension: SET, the key owned by the connection's store session.
    SESSION_SET = 0xE5
    #: Extension: COMPARE_SET, a write it makes owned by the connection's store session.
    SESSION_COMPARE_SET = 0xE6
    #: Extension: a queue push the server makes when the store session ends.
    SESSION_WILL = 0xE7
    #: Extension: end the connection's store session now; 0 out.
    SESSION_CLOSE = 0xE8
    #: Extension: wait for the first of the keys; STOP_WAITING, its index and its value out.
    WAIT_ANY = 0xE9
    #: Extension: "still here", allowed while a wait is parked; no reply (it keeps the
    #: connection's store session alive without cancelling the wait).
    WAIT_KEEPALIVE = 0xEA


class Field(enum.Enum):
    """The field types of requests, in wire order."""

    U32 = enum.auto()
    I64 = enum.auto()
    KEY = enum.auto()
    VALUE = enum.auto()
    KEYS = enum.auto()  # u64 count, then that many keys
    ITEMS = enum.auto()  # i64 count, then that many (key, value) pairs


#: The fields of a request after its opcode, in wire order.
Layout = tuple[Field, ...]

_KEYS: Final[Layout] = (Field.KEYS,)
_KEY: Final[Layout] = (Field.KEY,)
_KEY_VALUE: Final[Layout] = (Field.KEY, Field.VALUE)


def _keys_field(keys: Sequence[bytes]) -> bytes:
    return U64.pack(len(keys)) + blob_fields(keys)


def _items_field(items: Sequence[tuple[bytes, bytes]]) -> bytes:
    return I64.pack(len(items)) + b"".join([blob_field(k) + blob_field(v) for k, v in items])


_FIELD_ENCODERS: Final[dict[Field, Callable[[Any], bytes]]] = {
    Field.U32: U32.pack,
    Field.I64: I64.pack,
    Field.KEY: blob_field,
    Field.VALUE: blob_field,
    Field.KEYS: _keys_field,
    Field.ITEMS: _items_field,
}


class Message:
    """Base of every request: its opcode, its layout and its reply's format."""

    __slots__ = ()
    opcode: ClassVar[Opcode]
    layout: ClassVar[Layout]
    reply: ClassVar[ReplyFormat[Any]]

    def encode(self) -> bytes:
        """The request as bytes on the wire: its opcode, then its fields as its layout says."""
        return encode_request(self)


def _op(opcode: Opcode) -> bytes:
    return bytes((opcode,))


_SET: Final = _op(Opcode.SET)
_COMPARE_SET: Final = _op(Opcode.COMPARE_SET)
_GET: Final = _op(Opcode.GET)
_ADD: Final = _op(Opcode.ADD)
_WAIT: Final = _op(Opcode.WAIT)
_WAIT_GET: Final = _op(Opcode.WAIT_GET)
_ONE: Final = U64.pack(1)


@dataclass(frozen=True, slots=True)
class Validate(Message):
    """First message of every connection."""

    opcode: ClassVar[Opcode] = Opcode.VALIDATE
    layout: ClassVar[Layout] = (Field.U32,)
    reply: ClassVar[NoReply] = NO_REPLY
    magic: int = VALIDATE_MAGIC


@dataclass(frozen=True, slots=True)
class Set(Message):
    opcode: ClassVar[Opcode] = Opcode.SET
    layout: ClassVar[Layout] = _KEY_VALUE
    reply: ClassVar[NoReply] = NO_REPLY
    key: bytes
    value: bytes

    @staticmethod
    def frame(key: bytes, value: bytes) -> bytes:
        """``Set(key, value).encode()``, without building the request."""
        return b"".join((_SET, U64.pack(len(key)), key, U64.pack(len(value)), value))


@dataclass(frozen=True, slots=True)
class CompareSet(Message):
    opcode: ClassVar[Opcode] = Opcode.COMPARE_SET
    layout: ClassVar[Layout] = (Field.KEY, Field.VALUE, Field.VALUE)
    reply: ClassVar[BytesReply] = BYTES_REPLY
    key: bytes
    expected: bytes
    desired: bytes

    @staticmethod
    def frame(key: bytes, expected: bytes, desired: bytes) -> bytes:
        """``CompareSet(key, expected, desired).encode()``, without building the request."""
        pack = U64.pack
        sizes = (pack(len(key)), pack(len(expected)), pack(len(desired)))
        return b"".join((_COMPARE_SET, sizes[0], key, sizes[1], expected, sizes[2], desired))


@dataclass(frozen=True, slots=True)
class Get(Message):
    opcode: ClassVar[Opcode] = Opcode.GET
    layout: ClassVar[Layout] = _KEY
    reply: ClassVar[BytesReply] = BYTES_REPLY
    key: bytes

    @staticmethod
    def frame(key: bytes) -> bytes:
        """``Get(key).encode()``, without building the request."""
        return _GET + U64.pack(len(key)) + key


@dataclass(frozen=True, slots=True)
class Add(Message):
    opcode: ClassVar[Opcode] = Opcode.ADD
    layout: ClassVar[Layout] = (Field.KEY, Field.I64)
    reply: ClassVar[NumberReply] = NUMBER_REPLY
    key: bytes
    delta: int

    @staticmethod
    def frame(key: bytes, delta: int) -> bytes:
        """``Add(key, delta).encode()``, without building the request."""
        return b"".join((_ADD, U64.pack(len(key)), key, I64.pack(delta)))


@dataclass(frozen=True, slots=True)
class Check(Message):
    opcode: ClassVar[Opcode] = Opcode.CHECK
    layout: ClassVar[Layout] = _KEYS
    reply: ClassVar[FlagReply] = FLAG_REPLY
    keys: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Wait(Message):
    opcode: ClassVar[Opcode] = Opcode.WAIT
    layout: ClassVar[Layout] = _KEYS
    reply: ClassVar[FlagReply] = FLAG_REPLY
    keys: tuple[bytes, ...]

    @staticmethod
    def frame(keys: Sequence[bytes]) -> bytes:
        """``Wait(keys).encode()``, without building the request."""
        if len(keys) == 1:  # a PyTorch server's get
            return b"".join((_WAIT, _ONE, U64.pack(len(keys[0])), keys[0]))
        return _WAIT + _keys_field(keys)


@dataclass(frozen=True, slots=True)
class GetNumKeys(Message):
    opcode: ClassVar[Opcode] = Opcode.GETNUMKEYS
    layout: ClassVar[Layout] = ()
    reply: ClassVar[NumberReply] = NUMBER_REPLY


@dataclass(frozen=True, slots=True)
class DeleteKey(Message):
    opcode: ClassVar[Opcode] = Opcode.DELETE_KEY
    layout: ClassVar[Layout] = _KEY
    reply: ClassVar[NumberReply] = NUMBER_REPLY
    key: bytes


@dataclass(frozen=True, slots=True)
class Append(Message):
    opcode: ClassVar[Opcode] = Opcode.APPEND
    layout: ClassVar[Layout] = _KEY_VALUE
    reply: ClassVar[NoReply] = NO_REPLY
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class MultiGet(Message):
    opcode: ClassVar[Opcode] = Opcode.MULTI_GET
    layout: ClassVar[Layout] = _KEYS
    reply: ClassVar[ValuesReply] = VALUES_REPLY
    keys: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class MultiSet(Message):
    opcode: ClassVar[Opcode] = Opcode.MULTI_SET
    layout: ClassVar[Layout] = (Field.ITEMS,)
    reply: ClassVar[NoReply] = NO_REPLY
    items: tuple[tuple[bytes, bytes], ...]


@dataclass(frozen=True, slots=True)
class CancelWait(Message):
    opcode: ClassVar[Opcode] = Opcode.CANCEL_WAIT
    layout: ClassVar[Layout] = ()
    reply: ClassVar[FlagReply] = FLAG_REPLY


@dataclass(frozen=True, slots=True)
class Ping(Message):
    opcode: ClassVar[Opcode] = Opcode.PING
    layout: ClassVar[Layout] = (Field.U32,)
    reply: ClassVar[NonceReply] = NONCE_REPLY
    nonce: int


@dataclass(frozen=True, slots=True)
class QueuePush(Message):
    opcode: ClassVar[Opcode] = Opcode.QUEUE_PUSH
    layout: ClassVar[Layout] = _KEY_VALUE
    reply: ClassVar[NoReply] = NO_REPLY
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class QueuePop(Message):
    opcode: ClassVar[Opcode] = Opcode.QUEUE_POP
    layout: ClassVar[Layout] = _KEY
    reply: ClassVar[QueuePopReply] = QUEUE_POP_REPLY
    key: bytes


@dataclass(frozen=True, slots=True)
class QueueLen(Message):
    opcode: ClassVar[Opcode] = Opcode.QUEUE_LEN
    layout: ClassVar[Layout] = _KEY
    reply: ClassVar[NumberReply] = NUMBER_REPLY
    key: bytes


@dataclass(frozen=True, slots=True)
class ListKeys(Message):
    opcode: ClassVar[Opcode] = Opcode.LIST_KEYS
    layout: ClassVar[Layout] = ()
    reply: ClassVar[KeyListReply] = KEY_LIST_REPLY


@dataclass(frozen=True, slots=True)
class Barrier(Message):
    opcode: ClassVar[Opcode] = Opcode.BARRIER
    layout: ClassVar[Layout] = (Field.KEY, Field.I64)
    reply: ClassVar[FlagReply] = FLAG_REPLY
    key: bytes
    world_size: int


@dataclass(frozen=True, slots=True)
class WaitGet(Message):
    """Extension: WAIT then MULTI_GET in one round trip."""

    opcode: ClassVar[Opcode] = Opcode.WAIT_GET
    layout: ClassVar[Layout] = _KEYS
    reply: ClassVar[WaitGetReply] = WAIT_GET_REPLY
    keys: tuple[bytes, ...]

    @staticmethod
    def frame(keys: Sequence[bytes]) -> bytes:
        """``WaitGet(keys).encode()``, without building the request."""
        if len(keys) == 1:  # a get
            return b"".join((_WAIT_GET, _ONE, U64.pack(len(keys[0])), keys[0]))
        return _WAIT_GET + _keys_field(keys)


@dataclass(frozen=True, slots=True)
class WaitAny(Message):
    """Extension: wait until one of the keys exists; its index and value come back.

    The reply is WAIT_GET's with two values: the index of the first key that
    exists (lowest index first, in decimal digits) and its value (empty for a
    key that holds a queue only).
    """

    opcode: ClassVar[Opcode] = Opcode.WAIT_ANY
    layout: ClassVar[Layout] = _KEYS
    reply: ClassVar[WaitGetReply] = WAIT_GET_REPLY
    keys: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class WaitKeepAlive(Message):
    """Extension: a frame a client sends while its wait is parked, to show it lives.

    No reply. A store session ends after its timeout without a frame; a
    parked wait sends this instead of being cancelled and sent again.
    """

    opcode: ClassVar[Opcode] = Opcode.WAIT_KEEPALIVE
    layout: ClassVar[Layout] = ()
    reply: ClassVar[NoReply] = NO_REPLY


@dataclass(frozen=True, slots=True)
class Stats(Message):
    """Extension: ask for the server's counters (see :class:`~tp_store.protocol.ServerStats`)."""

    opcode: ClassVar[Opcode] = Opcode.STATS
    layout: ClassVar[Layout] = ()
    reply: ClassVar[BytesReply] = BYTES_REPLY


@dataclass(frozen=True, slots=True)
class AuthChallenge(Message):
    """Extension: the client's nonce; answered with the server's (empty: no secret)."""

    opcode: ClassVar[Opcode] = Opcode.AUTH_CHALLENGE
    layout: ClassVar[Layout] = _KEY
    reply: ClassVar[BytesReply] = BYTES_REPLY
    nonce: bytes


@dataclass(frozen=True, slots=True)
class AuthProof(Message):
    """Extension: the client's proof; answered with the server's (empty: refused)."""

    opcode: ClassVar[Opcode] = Opcode.AUTH_PROOF
    layout: ClassVar[Layout] = _KEY
    reply: ClassVar[BytesReply] = BYTES_REPLY
    proof: bytes


@dataclass(frozen=True, slots=True)
class SessionOpen(Message):
    """Extension: open the connection's store session, ended after ``timeout_ms`` of silence."""

    opcode: ClassVar[Opcode] = Opcode.SESSION_OPEN
    layout: ClassVar[Layout] = (Field.I64,)
    reply: ClassVar[NumberReply] = NUMBER_REPLY
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class SessionSet(Message):
    """Extension: SET through the connection's store session (the key is owned by it)."""

    opcode: ClassVar[Opcode] = Opcode.SESSION_SET
    layout: ClassVar[Layout] = _KEY_VALUE
    reply: ClassVar[NoReply] = NO_REPLY
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class SessionCompareSet(Message):
    """Extension: COMPARE_SET through the connection's store session."""

    opcode: ClassVar[Opcode] = Opcode.SESSION_COMPARE_SET
    layout: ClassVar[Layout] = (Field.KEY, Field.VALUE, Field.VALUE)
    reply: ClassVar[BytesReply] = BYTES_REPLY
    key: bytes
    expected: bytes
    desired: bytes


@dataclass(frozen=True, slots=True)
class SessionWill(Message):
    """Extension: push ``value`` onto the queue ``queue`` when the store session ends."""

    opcode: ClassVar[Opcode] = Opcode.SESSION_WILL
    layout: ClassVar[Layout] = _KEY_VALUE
    reply: ClassVar[NoReply] = NO_REPLY
    queue: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class SessionClose(Message):
    """Extension: end the connection's store session (its keys deleted, its wills pushed)."""

    opcode: ClassVar[Opcode] = Opcode.SESSION_CLOSE
    layout: ClassVar[Layout] = ()
    reply: ClassVar[NumberReply] = NUMBER_REPLY


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
    | SessionOpen
    | SessionSet
    | SessionCompareSet
    | SessionWill
    | SessionClose
    | WaitAny
    | WaitKeepAlive
)

#: Every request type, by opcode.
REQUEST_TYPES: Final[dict[int, type[Request]]] = {
    request_type.opcode: request_type
    for request_type in (
        Validate,
        Set,
        CompareSet,
        Get,
        Add,
        Check,
        Wait,
        GetNumKeys,
        DeleteKey,
        Append,
        MultiGet,
        MultiSet,
        CancelWait,
        Ping,
        QueuePush,
        QueuePop,
        QueueLen,
        ListKeys,
        Barrier,
        WaitGet,
        Stats,
        AuthChallenge,
        AuthProof,
        SessionOpen,
        SessionSet,
        SessionCompareSet,
        SessionWill,
        SessionClose,
        WaitAny,
        WaitKeepAlive,
    )
}

#: Each opcode's request type and fields, from the classes' declarations.
LAYOUTS: Final[dict[int, tuple[type[Request], Layout]]] = {
    opcode: (request_type, request_type.layout) for opcode, request_type in REQUEST_TYPES.items()
}

#: Per request type: its opcode byte, and an encoder for each field in wire order.
_ENCODERS: Final[dict[type, tuple[bytes, tuple[tuple[str, Callable[[Any], bytes]], ...]]]] = {
    request_type: (
        _op(request_type.opcode),
        tuple(
            (field.name, _FIELD_ENCODERS[kind])
            for field, kind in zip(fields(request_type), request_type.layout, strict=True)
        ),
    )
    for request_type in REQUEST_TYPES.values()
}


def encode_request(request: Message) -> bytes:
    """``request`` as bytes on the wire: its opcode, then its fields as its layout says."""
    opcode, encoders = _ENCODERS[type(request)]
    return opcode + b"".join([encode(getattr(request, name)) for name, encode in encoders])
