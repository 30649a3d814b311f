"""The server's side of one connection, without I/O.

A :class:`ServerSession` takes the bytes a client sent (:meth:`ServerSession.receive`),
applies its requests to the shared :class:`~tp_store.server.state.StoreState`
(:meth:`ServerSession.serve`) and leaves the replies in
:attr:`ServerSession.outbox` for the I/O layer to write in one go. The
session rules live here: VALIDATE first, what may be sent before
authenticating and how much, the extensions offered in the handshake PING,
one parked wait at a time, replies bounded by the message limit, a
bounded number of requests per turn so that no client starves the others,
and the store-session extension's (:mod:`~tp_store.protocol.store_sessions`).
Every violation raises :class:`~tp_store.errors.ProtocolError` (or
``ValueError`` for a request the state refuses); the I/O layer then closes
the connection.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import Any, Final

from tp_store.errors import ProtocolError, StoreLimitError
from tp_store.server.state import BarrierWaiter, StoreState, Waiter

from .auth import ServerAuthenticator
from .limits import Limits
from .messages import (
    EXTENSION_ACCEPT,
    EXTENSION_ACCEPT_AUTH,
    EXTENSION_OFFER,
    LAYOUTS,
    REQUEST_TYPES,
    VALIDATE_MAGIC,
    Opcode,
)
from .phases import Event, Phase, advance
from .replies import (
    BYTES_REPLY,
    I64,
    NONCE_REPLY,
    U32,
    U64,
    WAIT_GET_REPLY,
    CheckReply,
    WaitReply,
)
from .requests import Layouts, RequestParser
from .stats import ServerStats, stats_document
from .store_sessions import (
    EndCause,
    SessionHandle,
    SessionHost,
    check_session_open,
    open_session_of,
    session_timeout,
)

#: Requests a connection is served in one turn before the others get theirs:
#: no client can starve the rest by pipelining.
REQUESTS_PER_TURN: Final = 64
#: Requests a connection may send before it has authenticated to a server
#: with a secret (our client needs four: VALIDATE, PING, the exchange).
REQUESTS_BEFORE_AUTH: Final = 16
#: Reply bytes a turn gathers before it lets them out (and finds whether the
#: client reads them): a pipeline of big replies never piles up in memory.
FLUSH_BYTES: Final = 256 * 1024
#: Bytes a parked wait is counted for besides its keys (the waiter and its
#: entries in the state's tables).
PARKED_KEY_OVERHEAD: Final = 128

_STOP_WAITING: Final = b"\x00"
_WAIT_CANCELED: Final = b"\x01"
_READY: Final = b"\x00"
_NOT_READY: Final = b"\x01"
_EXTENSIONS_ACCEPTED: Final = NONCE_REPLY.encode(EXTENSION_ACCEPT)
_EXTENSIONS_ACCEPTED_AUTH: Final = NONCE_REPLY.encode(EXTENSION_ACCEPT_AUTH)
_AUTH_REFUSED: Final = BYTES_REPLY.encode(b"")

# The head of most requests: an opcode and a u64 (a key's length, or a key count).
_unpack_head = struct.Struct("<BQ").unpack_from
_unpack_u64 = U64.unpack_from
_unpack_i64 = I64.unpack_from
_pack_i64 = I64.pack
_pack_u64 = U64.pack
# Plain ints: compared with the opcode byte without the enum's lookups.
_OP_VALIDATE, _OP_PING = int(Opcode.VALIDATE), int(Opcode.PING)
_OP_SET, _OP_GET, _OP_ADD, _OP_CHECK, _OP_WAIT, _OP_WAIT_GET = map(
    int, (Opcode.SET, Opcode.GET, Opcode.ADD, Opcode.CHECK, Opcode.WAIT, Opcode.WAIT_GET)
)
# VALIDATE and the extension offer as they arrive: compared without unpacking.
_VALIDATE: Final = bytes((_OP_VALIDATE,)) + U32.pack(VALIDATE_MAGIC)
#: The sizes :meth:`ServerSession._answer_handshake` answers: a VALIDATE or a
#: PING alone, or both in one read.
_HANDSHAKE_LENGTHS: Final = (5, 10)
_EXTENSION_OFFER: Final = U32.pack(EXTENSION_OFFER)
#: The requests the direct path answers when they name one key.
_ONE_KEY_OPCODES: Final = frozenset((_OP_WAIT, _OP_WAIT_GET, _OP_CHECK))

#: Which requests are parsed in a phase (a WAITING connection may only cancel, or
#: say that it lives).
_WAITING_LAYOUTS: Final[Layouts] = {
    opcode: LAYOUTS[opcode] for opcode in (Opcode.CANCEL_WAIT, Opcode.WAIT_KEEPALIVE)
}


class AuthRefused(ProtocolError):
    """A connection failed or skipped authentication."""


class Turn(enum.Enum):
    """Why :meth:`ServerSession.serve` returned."""

    #: No whole request is left: wait for more bytes.
    IDLE = "idle"
    #: Replies piled up: write them, then call again (unless the client stopped reading).
    FLUSH = "flush"
    #: The turn is over with requests left: serve the other connections first.
    YIELD = "yield"


class ServerSession:
    """One client connection's protocol state, without I/O.

    ``woken`` is called when a parked wait is answered from another
    connection's request: the reply is in :attr:`outbox` and the I/O layer
    should write it, or (given an error) close the connection. ``ops`` counts
    requests by opcode byte (the server's statistics); ``stats`` makes the
    STATS document. ``sessions`` opens and ends store sessions (None: the
    server offers none), and ``expired(reason)`` must close the connection when
    its store session ended for silence.
    """

    __slots__ = (
        "_auth",
        "_expired",
        "_limits",
        "_ops",
        "_parked_bytes",
        "_parser",
        "_pending",
        "_requests_before_auth",
        "_secret",
        "_session_opened",
        "_sessions",
        "_state",
        "_stats",
        "_turn_left",
        "_woken",
        "admitted",
        "extended",
        "outbox",
        "pending_bytes",
        "phase",
        "served",
        "store_session",
    )

    def __init__(
        self,
        state: StoreState,
        limits: Limits,
        *,
        secret: bytes | None,
        stats: Callable[[], ServerStats],
        ops: list[int],
        woken: Callable[[Exception | None], None],
        sessions: SessionHost | None = None,
        expired: Callable[[str], None] | None = None,
    ) -> None:
        self._state = state
        self._limits = limits
        self._secret = secret
        self._stats = stats
        self._ops = ops
        self._woken = woken
        self._sessions = sessions
        self._expired = expired
        #: The connection's open store session (None: none, or ended).
        self.store_session: SessionHandle | None = None
        self._session_opened = False
        self.phase = _HANDSHAKE
        #: Whether requests other than the handshake and authentication may be
        #: served (SERVING or WAITING).
        self.admitted = False
        # Made when the general path first needs it (see _new_parser): what
        # clients send as a rule never does.
        self._parser: RequestParser | None = None
        self._requests_before_auth = REQUESTS_BEFORE_AUTH
        self._auth: ServerAuthenticator | None = None
        self._pending: Waiter | BarrierWaiter | None = None
        #: What the parked wait and the store session hold, counted in the memory budget.
        self.pending_bytes = 0
        self._parked_bytes = 0  # the parked wait's part of it
        #: Set once the client offers the extensions in a PING: STATS is refused
        #: before, as on a PyTorch server, which does not know the opcode.
        self.extended = False
        #: Replies not yet written.
        self.outbox: list[bytes] = []
        self._turn_left = REQUESTS_PER_TURN
        #: Requests the last :meth:`serve` applied.
        self.served = 0

    # -- what the I/O layer reads -------------------------------------------------

    @property
    def parked(self) -> bool:
        """Whether a WAIT, WAIT_GET or BARRIER is parked."""
        return self._pending is not None

    @property
    def buffered(self) -> int:
        """Request bytes received and not yet served."""
        parser = self._parser
        return 0 if parser is None else parser.buffered

    # -- driving it -----------------------------------------------------------------
    def receive(self, data: bytes) -> None:
        """Add bytes received from the client."""
        parser = self._parser
        if parser is None:
            parser = self._parser = self._new_parser()
        parser.feed(data)

    def _new_parser(self) -> RequestParser:
        """A parser set for the phase the connection is in.

        Until admitted, it refuses every request but the handshake and
        authentication from its opcode, and anything over a few hundred bytes;
        while a wait is parked, everything but CANCEL_WAIT.
        """
        phase = self.phase
        parser = RequestParser(self._limits, authenticated=self._secret is None or self.admitted)
        if phase is not _HANDSHAKE:
            parser.validated()
        if phase is _WAITING:
            parser.accept(_WAITING_LAYOUTS, self._limits.max_message_bytes, _WHILE_WAITING)
        return parser

    def serve(self) -> Turn:
        """Apply the whole requests received, leaving their replies in :attr:`outbox`."""
        parser = self._parser
        self.served = 0
        if parser is None:  # nothing received
            return Turn.IDLE
        ops = self._ops
        out = self.outbox
        size = 0
        left = self._turn_left
        served = 0
        while served < left:
            parsed = parser.next_fields()
            if parsed is None:
                self.served = served
                self._turn_left = REQUESTS_PER_TURN
                return Turn.IDLE
            opcode, fields = parsed
            ops[opcode] += 1
            served += 1
            handler, pack = _HANDLERS[opcode]
            value = handler(self, fields)
            if value is not None:
                encoded = pack(value)
                out.append(encoded)
                size += len(encoded)
                if size >= FLUSH_BYTES and served < left:
                    self.served = served
                    self._turn_left = left - served
                    return Turn.FLUSH
        self.served = served
        self._turn_left = REQUESTS_PER_TURN
        return Turn.YIELD if parser.buffered else Turn.IDLE

    def answer(self, data: bytes) -> bytes | None:
        """The reply to ``data`` when it is exactly one whole request of those a client
        sends as a rule: VALIDATE (on a server without a secret) and PING, SET,
        GET, ADD, and CHECK, WAIT or WAIT_GET of one key (b"": applied, no reply,
        or a wait parked until ``woken``). It is applied and counted as
        :meth:`serve` would, without the parser and the turn. None: nothing was
        done; :meth:`receive` and :meth:`serve` it.
        """
        length = len(data)
        limits = self._limits
        parser = self._parser
        if (
            self.phase is not _SERVING
            or length < 9
            or length > limits.max_message_bytes  # the parser refuses it
            or (parser is not None and parser.buffered)
        ):
            return self._answer_handshake(data) if length in _HANDSHAKE_LENGTHS else None
        opcode, size = _unpack_head(data)
        if opcode == _OP_ADD:
            if length != 17 + size or size > limits.max_key_bytes:
                return None
            total = self._state.add(data[9 : 9 + size], _unpack_i64(data, 9 + size)[0])
            reply = _pack_i64(total)
        elif opcode == _OP_GET:
            if length != 9 + size or size > limits.max_key_bytes:
                return None
            try:  # a subscript costs less than a get(), and the key is there as a rule
                value = self._state.data[data[9:]]
            except KeyError:
                value = b""
            reply = _pack_u64(len(value)) + value
        elif opcode == _OP_SET:
            stop = 9 + size
            if length < stop + 8 or size > limits.max_key_bytes:
                return None
            value_size: int = _unpack_u64(data, stop)[0]
            if length != stop + 8 + value_size or value_size > limits.max_value_bytes:
                return None
            self._state.set(data[9:stop], data[stop + 8 :])
            reply = b""
        elif opcode in _ONE_KEY_OPCODES:
            if size != 1 or length < 17:
                return None
            size = _unpack_u64(data, 9)[0]
            if length != 17 + size or size > limits.max_key_bytes:
                return None
            key = data[17:]
            state = self._state
            if opcode == _OP_WAIT:
                # A value first (the common case), then the queues, without a call.
                if key in state.data or state.exists(key):
                    reply = _STOP_WAITING
                else:
                    self._park_key(key, self._wake)
                    reply = b""
            elif opcode == _OP_WAIT_GET:
                found = state.data.get(key)
                if found is not None:
                    reply = b"".join((_STOP_WAITING, _pack_u64(len(found)), found))
                elif state.exists(key):
                    return None  # a queue's: the general path
                else:
                    self._park_key(key, self._wake_with_values)
                    reply = b""
            else:
                reply = _READY if key in state.data or state.exists(key) else _NOT_READY
        else:
            return None
        self._ops[opcode] += 1
        return reply

    def _answer_handshake(self, data: bytes) -> bytes | None:
        """The direct path's answer to five bytes, a VALIDATE on a server without a
        secret or a PING, or to ten, both at once (what PyTorch's client sends
        first); None for anything else."""
        parser = self._parser
        if parser is not None and parser.buffered:
            return None
        phase = self.phase
        if phase is _HANDSHAKE:
            if self._secret is not None or data[:5] != _VALIDATE:
                return None  # the parser says why, or authenticates
            if len(data) == 5:
                self._validated()
                return b""
            if data[5] != _OP_PING:
                return None
            self._validated()
            data = data[5:]
        elif phase is not _SERVING or len(data) != 5 or data[0] != _OP_PING:
            return None
        nonce = data[1:]
        if nonce == _EXTENSION_OFFER:
            self.extended = True
            nonce = _EXTENSIONS_ACCEPTED
        self._ops[_OP_PING] += 1
        return nonce  # the reply is the nonce, in the same layout

    def _validated(self) -> None:
        """The direct path's VALIDATE, on a server without a secret."""
        self.phase = advance(self.phase, _HELLO)
        self.admitted = True
        self._ops[_OP_VALIDATE] += 1

    def _park_key(self, key: bytes, wake: Callable[[Waiter], None]) -> None:
        """Park a wait for ``key``, which does not exist."""
        waiter = Waiter((key,), wake)
        self._state.park_missing(waiter, key)
        self._parked(waiter, len(key) + PARKED_KEY_OVERHEAD)

    def close(self) -> None:
        """End the session: its parked wait is dropped, its store session ended;
        nothing more is served."""
        if self._pending is not None:
            self._drop_pending()
        if self.store_session is not None:
            self._end_store_session(EndCause.DISCONNECTED)
        self.phase = advance(self.phase, _CLOSED)
        self.admitted = False
        if self._parser is not None:
            self._parser.clear()  # its buffer is garbage now

    # -- session rules ----------------------------------------------------------------
    def _before_auth(self) -> None:
        self._requests_before_auth -= 1
        if self._requests_before_auth < 0:
            raise AuthRefused(
                f"more than {REQUESTS_BEFORE_AUTH} requests sent before authenticating"
            )

    def _bounded(self, values: list[bytes]) -> list[bytes]:
        """``values`` if a reply carrying them stays within the message limit."""
        limit = self._limits.max_message_bytes
        if sum(map(len, values)) + 8 * len(values) > limit:
            raise StoreLimitError(
                f"a reply of {len(values)} values would exceed the limit of {limit} bytes"
            )
        return values

    def _park(self, keys: tuple[bytes, ...], wake: Callable[[Waiter], None]) -> bool:
        """True if the keys exist already; else the wait stays parked until ``wake``."""
        if self._state.check(keys):  # the common case: no waiter to build
            return True
        waiter = Waiter(keys, wake)
        self._state.park(waiter)
        self._parked(waiter, sum(map(len, keys)) + PARKED_KEY_OVERHEAD * len(keys))
        return False

    def _parked(self, waiter: Waiter | BarrierWaiter, size: int) -> None:
        self._pending = waiter
        self._parked_bytes = size
        self.pending_bytes += size
        self.phase = advance(self.phase, _PARKED)
        if self._parser is not None:
            self._parser.accept(_WAITING_LAYOUTS, self._limits.max_message_bytes, _WHILE_WAITING)

    def _unparked(self, event: Event) -> None:
        self._pending = None
        self.pending_bytes -= self._parked_bytes
        self._parked_bytes = 0
        self.phase = advance(self.phase, event)
        if self._parser is not None:
            self._parser.authenticated()

    def _wake(self, waiter: Waiter | BarrierWaiter) -> None:
        self._unparked(_WOKEN)
        self.outbox.append(_STOP_WAITING)
        self._woken(None)

    def _wake_with_values(self, waiter: Waiter) -> None:
        self._unparked(_WOKEN)
        try:
            values = self._bounded(self._state.multi_get(waiter.keys))
        except StoreLimitError as exc:  # this connection's fault, not the writer's
            self._woken(exc)
            return
        self.outbox.append(WAIT_GET_REPLY.encode((WaitReply.STOP_WAITING, values)))
        self._woken(None)

    def _wake_any(self, waiter: Waiter) -> None:
        self._state.unpark(waiter)  # from the keys that are still missing
        self._unparked(_WOKEN)
        found = self._state.first_existing(waiter.keys)
        assert found is not None, "woken by a write of one of its keys"
        self.outbox.append(WAIT_GET_REPLY.encode(_found_any(*found)))
        self._woken(None)

    def _drop_pending(self) -> None:
        pending = self._pending
        if pending is None:
            return
        self._unparked(_CANCELLED)
        if isinstance(pending, Waiter):
            self._state.unpark(pending)
        else:
            self._state.leave_barrier(pending)

    # -- the requests, by opcode ------------------------------------------------------
    def _get(self, fields: list[Any]) -> bytes:
        return self._state.get(fields[0])

    def _add(self, fields: list[Any]) -> int:
        return self._state.add(fields[0], fields[1])

    def _set(self, fields: list[Any]) -> None:
        self._state.set(fields[0], fields[1])

    def _wait_get(self, fields: list[Any]) -> tuple[int, list[bytes]] | None:
        keys = fields[0]
        if len(keys) == 1:  # a get: one value, within the limits by construction
            value = self._state.data.get(keys[0])
            if value is not None:
                return (WaitReply.STOP_WAITING, [value])
        if self._park(keys, self._wake_with_values):
            return (WaitReply.STOP_WAITING, self._bounded(self._state.multi_get(keys)))
        return None

    def _wait_any(self, fields: list[Any]) -> tuple[int, list[bytes]] | None:
        keys: tuple[bytes, ...] = fields[0]
        if not keys:
            raise ProtocolError("WAIT_ANY needs at least one key")
        found = self._state.first_existing(keys)
        if found is not None:
            return _found_any(*found)
        waiter = Waiter(keys, self._wake_any, any_of=True)
        self._state.park_any(waiter)
        self._parked(waiter, sum(map(len, keys)) + PARKED_KEY_OVERHEAD * len(keys))
        return None

    def _wait_keepalive(self, fields: list[Any]) -> None:
        """Nothing to do: its bytes arriving kept the store session alive."""

    def _compare_set(self, fields: list[Any]) -> bytes:
        return self._state.compare_set(fields[0], fields[1], fields[2])

    def _wait(self, fields: list[Any]) -> int | None:
        return WaitReply.STOP_WAITING if self._park(fields[0], self._wake) else None

    def _check(self, fields: list[Any]) -> int:
        return CheckReply.READY if self._state.check(fields[0]) else CheckReply.NOT_READY

    def _multi_get(self, fields: list[Any]) -> list[bytes]:
        return self._bounded(self._state.multi_get(fields[0]))

    def _multi_set(self, fields: list[Any]) -> None:
        self._state.multi_set(fields[0])

    def _append(self, fields: list[Any]) -> None:
        self._state.append(fields[0], fields[1])

    def _delete_key(self, fields: list[Any]) -> int:
        return int(self._state.delete(fields[0]))

    def _num_keys(self, fields: list[Any]) -> int:
        return self._state.num_keys()

    def _cancel_wait(self, fields: list[Any]) -> int:
        self._drop_pending()
        return WaitReply.WAIT_CANCELED

    def _ping(self, fields: list[Any]) -> int:
        if not self.admitted:
            self._before_auth()
        nonce: int = fields[0]
        if nonce == EXTENSION_OFFER:
            self.extended = True
            return EXTENSION_ACCEPT if self.admitted else EXTENSION_ACCEPT_AUTH
        return nonce

    def _queue_push(self, fields: list[Any]) -> None:
        self._state.queue_push(fields[0], fields[1])

    def _queue_pop(self, fields: list[Any]) -> tuple[int, bytes | None]:
        return self._state.queue_pop(fields[0])

    def _queue_len(self, fields: list[Any]) -> int:
        return self._state.queue_len(fields[0])

    def _list_keys(self, fields: list[Any]) -> list[bytes]:
        return self._bounded(self._state.list_keys())

    def _barrier(self, fields: list[Any]) -> int | None:
        barrier = BarrierWaiter(fields[0], fields[1], self._wake)
        if self._state.barrier(barrier):
            return WaitReply.STOP_WAITING
        self._parked(barrier, 0)
        return None

    def _server_stats(self, fields: list[Any]) -> bytes:
        if not self.extended:
            raise ProtocolError("STATS sent before the protocol extensions were offered")
        return stats_document(self._stats())

    # -- the store-session extension (see store_sessions) --------------------------------
    def _session_open(self, fields: list[Any]) -> int:
        host = check_session_open(self.extended, self._sessions, self._session_opened)
        timeout = session_timeout(fields[0])
        self._session_opened = True
        handle = self.store_session = host.open(timeout, self._store_session_expired)
        return handle.id

    def _session_set(self, fields: list[Any]) -> None:
        handle = open_session_of(self.store_session, "SESSION_SET")
        self._state.session_set(handle.presence, fields[0], fields[1])
        self._count_store_session(handle)

    def _session_compare_set(self, fields: list[Any]) -> bytes:
        handle = open_session_of(self.store_session, "SESSION_COMPARE_SET")
        result = self._state.session_compare_set(handle.presence, fields[0], fields[1], fields[2])
        self._count_store_session(handle)
        return result

    def _session_will(self, fields: list[Any]) -> None:
        handle = open_session_of(self.store_session, "SESSION_WILL")
        self._state.book.add_will(handle.presence, fields[0], fields[1])
        self._count_store_session(handle)

    def _session_close(self, fields: list[Any]) -> int:
        open_session_of(self.store_session, "SESSION_CLOSE")
        self._end_store_session(EndCause.CLOSED)
        return 0

    def _count_store_session(self, handle: SessionHandle) -> None:
        """Count what the store session holds in the memory budget (with the parked wait)."""
        self.pending_bytes = self._parked_bytes + handle.presence.held_bytes

    def _store_session_expired(self, reason: str) -> None:
        """The host ended the store session for silence: the connection must close."""
        self.store_session = None
        self.pending_bytes = self._parked_bytes
        if self._expired is not None:
            self._expired(reason)

    def _end_store_session(self, cause: EndCause) -> None:
        handle = self.store_session
        if handle is not None and self._sessions is not None:
            self.store_session = None
            self._sessions.end(handle, cause)
            self.pending_bytes = self._parked_bytes

    def _validate(self, fields: list[Any]) -> None:
        if self.phase is _HANDSHAKE:
            event = Event.HELLO if self._secret is None else Event.HELLO_AUTH
            self.phase = advance(self.phase, event)
            self.admitted = self.phase is Phase.SERVING
        if not self.admitted:
            self._before_auth()

    def _auth_challenge(self, fields: list[Any]) -> bytes:
        if not self.admitted:
            self._before_auth()
        if not self.extended:
            raise ProtocolError("AUTH_CHALLENGE sent before the protocol extensions were offered")
        if self._auth is None:
            self._auth = ServerAuthenticator(self._secret)
        return self._auth.challenge(fields[0])

    def _auth_proof(self, fields: list[Any]) -> bytes:
        if not self.admitted:
            self._before_auth()
        if self._auth is None:
            raise ProtocolError("AUTH_PROOF sent before AUTH_CHALLENGE")
        server_proof = self._auth.check(fields[0])
        if server_proof is None:
            # Tell the client before closing, so it can say why it failed.
            self.outbox.append(_AUTH_REFUSED)
            raise AuthRefused("wrong proof of the secret (authentication failed)")
        self.phase = advance(self.phase, Event.AUTHENTICATED)
        self.admitted = True
        if self._parser is not None:
            self._parser.authenticated()
        return server_proof


_WHILE_WAITING: Final = "sent while a wait is pending"


def _found_any(index: int, value: bytes) -> tuple[int, list[bytes]]:
    """WAIT_ANY's reply: the index of the key found (decimal digits) and its value."""
    return (WaitReply.STOP_WAITING, [str(index).encode(), value])


# Read on every connection's way: a module global costs a tenth of an Enum member's lookup.
_SERVING: Final = Phase.SERVING
_HANDSHAKE: Final = Phase.HANDSHAKE
_WAITING: Final = Phase.WAITING
_HELLO: Final = Event.HELLO
_PARKED: Final = Event.PARKED
_WOKEN: Final = Event.WOKEN
_CANCELLED: Final = Event.CANCELLED
_CLOSED: Final = Event.CLOSED

_Handler = Callable[[ServerSession, list[Any]], Any]

#: Each opcode's handler and the format its value is encoded in (the
#: request's declared reply): dispatch by table, not by type tests.
_HANDLERS: Final[dict[int, tuple[_Handler, Callable[[Any], bytes]]]] = {
    opcode: (handler, REQUEST_TYPES[opcode].reply.pack)
    for opcode, handler in {
        Opcode.VALIDATE: ServerSession._validate,
        Opcode.SET: ServerSession._set,
        Opcode.COMPARE_SET: ServerSession._compare_set,
        Opcode.GET: ServerSession._get,
        Opcode.ADD: ServerSession._add,
        Opcode.CHECK: ServerSession._check,
        Opcode.WAIT: ServerSession._wait,
        Opcode.GETNUMKEYS: ServerSession._num_keys,
        Opcode.DELETE_KEY: ServerSession._delete_key,
        Opcode.APPEND: ServerSession._append,
        Opcode.MULTI_GET: ServerSession._multi_get,
        Opcode.MULTI_SET: ServerSession._multi_set,
        Opcode.CANCEL_WAIT: ServerSession._cancel_wait,
        Opcode.PING: ServerSession._ping,
        Opcode.QUEUE_PUSH: ServerSession._queue_push,
        Opcode.QUEUE_POP: ServerSession._queue_pop,
        Opcode.QUEUE_LEN: ServerSession._queue_len,
        Opcode.LIST_KEYS: ServerSession._list_keys,
        Opcode.BARRIER: ServerSession._barrier,
        Opcode.WAIT_GET: ServerSession._wait_get,
        Opcode.STATS: ServerSession._server_stats,
        Opcode.AUTH_CHALLENGE: ServerSession._auth_challenge,
        Opcode.AUTH_PROOF: ServerSession._auth_proof,
        Opcode.SESSION_OPEN: ServerSession._session_open,
        Opcode.SESSION_SET: ServerSession._session_set,
        Opcode.SESSION_COMPARE_SET: ServerSession._session_compare_set,
        Opcode.SESSION_WILL: ServerSession._session_will,
        Opcode.SESSION_CLOSE: ServerSession._session_close,
        Opcode.WAIT_ANY: ServerSession._wait_any,
        Opcode.WAIT_KEEPALIVE: ServerSession._wait_keepalive,
    }.items()
}
