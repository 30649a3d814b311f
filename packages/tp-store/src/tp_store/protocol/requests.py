"""The server's half of the framing: a byte stream from one client, parsed into requests.

:class:`RequestParser` accepts bytes split anywhere and yields each request
as soon as its last byte arrives, either as its fields
(:meth:`RequestParser.next_fields`, what the server dispatches on: no object
built) or as a typed :class:`~tp_store.protocol.messages.Message` (iterating).
Malformed input raises :class:`~tp_store.errors.ProtocolError` as soon as the
offending bytes arrive, and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from tp_store.errors import ProtocolError

from .limits import Limits
from .messages import LAYOUTS, VALIDATE_MAGIC, Field, Layout, Opcode, Request, Validate
from .replies import I64, U32, U64

#: Which requests a parser accepts now, by opcode.
Layouts = dict[int, tuple[type[Request], Layout]]

_KEY: Final = Field.KEY
_VALUE: Final = Field.VALUE
_I64: Final = Field.I64
_U32: Final = Field.U32
_ITEMS: Final = Field.ITEMS
_unpack_u64 = U64.unpack_from
_unpack_i64 = I64.unpack_from
_unpack_u32 = U32.unpack_from


class RequestBeforeAuthentication(ProtocolError):
    """A request other than the handshake and authentication, sent before authenticating."""


class RequestParser:
    """Turns a byte stream from one client into requests.

    The first request must be a VALIDATE with the right magic, as PyTorch's
    servers require. Any violation raises :class:`ProtocolError` as soon as
    the offending bytes arrive (a length over a limit is refused from its
    prefix alone); the caller should then drop the connection.

    Which requests are accepted, and how big one may be, is set with
    :meth:`accept` (the server's session does, phase by phase); a request of
    any other opcode is refused from its opcode byte. ``authenticated=False``
    starts with the handshake and authentication requests only.

    A request that arrives in many pieces is parsed once: the parser keeps
    how far it got, and never rescans it from its first byte.
    """

    __slots__ = (
        "_buf",
        "_fields",
        "_group",
        "_index",
        "_layout",
        "_layouts",
        "_limits",
        "_max_key",
        "_max_keys",
        "_max_message",
        "_max_value",
        "_opcode",
        "_pos",
        "_refusal",
        "_remaining",
        "_start",
        "_validated",
        "buffered",
    )

    def __init__(self, limits: Limits | None = None, *, authenticated: bool = True) -> None:
        limits = self._limits = limits or Limits()
        self._max_key = limits.max_key_bytes
        self._max_value = limits.max_value_bytes
        self._max_keys = limits.max_keys_per_request
        self._buf: bytes | bytearray = b""
        self._start = 0  # where the next request (or the one in progress) begins
        #: Bytes received but not yet returned as requests (kept, not computed:
        #: the server reads it before every request).
        self.buffered = 0
        self._validated = False
        # The request in progress: its fields so far (None: none begun).
        self._fields: list[Any] | None = None
        self._opcode = 0
        self._layout: Layout = ()
        self._index = 0  # its next field
        self._pos = 0  # the next unread byte
        self._group: list[bytes] = []  # keys, or keys and values alternately
        self._remaining = -1  # entries of the group still to read; -1 before its count
        self._layouts: Layouts = LAYOUTS
        self._max_message = limits.max_message_bytes
        self._refusal = "sent before authenticating"
        if not authenticated:
            self.accept(BEFORE_AUTH_LAYOUTS, BEFORE_AUTH_MESSAGE_BYTES)

    def accept(
        self, layouts: Layouts, max_message: int, refusal: str = "sent before authenticating"
    ) -> None:
        """Accept the requests of ``layouts`` only, each of at most ``max_message``
        bytes (and the limits'); another known opcode is refused with ``refusal``."""
        self._layouts = layouts
        self._max_message = min(max_message, self._limits.max_message_bytes)
        self._refusal = refusal

    def validated(self) -> None:
        """Take the connection's VALIDATE as received (the server's direct path checked it)."""
        self._validated = True

    def authenticated(self) -> None:
        """Accept every request from now on, within the limits."""
        self.accept(LAYOUTS, self._limits.max_message_bytes)

    def clear(self) -> None:
        """Drop what was received (the connection is over)."""
        self._buf = b""
        self._start = self._pos = self.buffered = 0
        self._fields = None
        self._group = []
        self._remaining = -1

    def feed(self, data: bytes) -> None:
        """Add bytes received from the client."""
        buf = self._buf
        start = self._start
        if start == len(buf):
            # The common case: nothing left over, nothing copied.
            self._buf = data if type(data) is bytes else bytes(data)
            self._start = self._pos = 0
            self.buffered = len(data)
            return
        if start:  # drop what was parsed, once per feed
            if self._fields is not None:
                self._pos -= start
            self._start = 0
            if isinstance(buf, bytearray):
                del buf[:start]
            else:
                buf = buf[start:]
        if isinstance(buf, bytearray):
            buf += data
        else:
            self._buf = bytearray(buf) + data
        self.buffered = len(self._buf) - self._start

    def __iter__(self) -> Iterator[Request]:
        return self

    def __next__(self) -> Request:
        parsed = self.next_fields()
        if parsed is None:
            raise StopIteration
        opcode, fields = parsed
        return LAYOUTS[opcode][0](*fields)

    def next_fields(self) -> tuple[int, list[Any]] | None:
        """The next whole request as its opcode and fields, or None until it has arrived."""
        buf = self._buf
        end = len(buf)
        start = self._start
        fields = self._fields
        if fields is None:
            if start == end:
                return None
            opcode = buf[start]
            entry = self._layouts.get(opcode)
            if entry is None:
                self._refuse(opcode)
            if not self._validated and opcode:
                raise ProtocolError(f"first message must be VALIDATE, got opcode {opcode}")
            layout = entry[1]  # type: ignore[index]  # _refuse never returns
            fields = []
            index = 0
            pos = start + 1
        else:
            opcode = self._opcode
            layout = self._layout
            index = self._index
            pos = self._pos
        count = len(layout)
        while index < count:
            kind = layout[index]
            if kind is _KEY or kind is _VALUE:
                # As in _read_group, inlined: one call less per field on every request.
                if pos + 8 > end:
                    break
                size: int = _unpack_u64(buf, pos)[0]
                stop = pos + 8 + size
                self._check_blob(kind, size, stop - start)
                if stop > end:
                    break
                fields.append(bytes(buf[pos + 8 : stop]))
                pos = stop
            elif kind is _I64:
                if pos + 8 > end:
                    break
                fields.append(_unpack_i64(buf, pos)[0])
                pos += 8
            elif kind is _U32:
                if pos + 4 > end:
                    break
                fields.append(_unpack_u32(buf, pos)[0])
                pos += 4
            else:
                pos, whole = self._read_group(buf, start, pos, kind is _ITEMS)
                if not whole:
                    break
                fields.append(self._take_group(kind is _ITEMS))
            index += 1
        else:
            self._fields = None
            self._start = pos
            self.buffered = end - pos
            if not self._validated:
                if fields[0] != VALIDATE_MAGIC:
                    raise ProtocolError(
                        f"first message must be VALIDATE, got {Validate(*fields)!r:.80}"
                    )
                self._validated = True
            return opcode, fields
        # The request is not whole yet: remember how far it got.
        self._fields = fields
        self._opcode = opcode
        self._layout = layout
        self._index = index
        self._pos = pos
        return None

    def _refuse(self, opcode: int) -> None:
        if opcode in LAYOUTS:
            name = Opcode(opcode).name
            if self._layouts is BEFORE_AUTH_LAYOUTS:
                raise RequestBeforeAuthentication(f"{name} {self._refusal}")
            raise ProtocolError(f"{name} {self._refusal}")
        raise ProtocolError(f"unknown opcode {opcode}")

    def _check_blob(self, kind: Field, size: int, request_size: int) -> None:
        limit = self._max_key if kind is _KEY else self._max_value
        if size > limit:
            what = "key" if kind is _KEY else "value"
            raise ProtocolError(f"{what} of {size} bytes exceeds the limit of {limit}")
        # Refused from the length prefix, before the bytes are buffered.
        if request_size > self._max_message:
            raise ProtocolError(
                f"request of at least {request_size} bytes exceeds the limit of {self._max_message}"
            )

    def _read_group(
        self, buf: bytes | bytearray, start: int, pos: int, items: bool
    ) -> tuple[int, bool]:
        """Read what has arrived of a KEYS or ITEMS field: the next unread byte, and
        whether the field is whole."""
        end = len(buf)
        if self._remaining < 0:
            if pos + 8 > end:
                return pos, False
            count: int = (_unpack_i64 if items else _unpack_u64)(buf, pos)[0]
            if not 0 <= count <= self._max_keys:
                raise ProtocolError(f"key count {count} outside 0..{self._max_keys}")
            pos += 8
            self._remaining = 2 * count if items else count
        group = self._group
        remaining = self._remaining
        while remaining:
            kind = _VALUE if items and len(group) % 2 == 1 else _KEY
            if pos + 8 > end:
                break
            size: int = _unpack_u64(buf, pos)[0]
            stop = pos + 8 + size
            self._check_blob(kind, size, stop - start)
            if stop > end:
                break
            group.append(bytes(buf[pos + 8 : stop]))
            pos = stop
            remaining -= 1
        if remaining:
            self._remaining = remaining
            return pos, False
        self._remaining = -1
        return pos, True

    def _take_group(self, items: bool) -> tuple[Any, ...]:
        group = self._group
        self._group = []
        if items:
            return tuple(zip(group[::2], group[1::2], strict=True))
        return tuple(group)


#: What a connection may send before it has authenticated to a server that
#: has a secret: the handshake and the authentication exchange, nothing else.
BEFORE_AUTH_LAYOUTS: Final[Layouts] = {
    opcode: LAYOUTS[opcode]
    for opcode in (Opcode.VALIDATE, Opcode.PING, Opcode.AUTH_CHALLENGE, Opcode.AUTH_PROOF)
}
#: The size a request may have before authentication (its fields are a magic,
#: a nonce or a proof): refused from its header, so an unauthenticated peer
#: never makes the server buffer more.
BEFORE_AUTH_MESSAGE_BYTES: Final = 256
