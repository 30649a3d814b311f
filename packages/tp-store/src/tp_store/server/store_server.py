"""The TCPStore server: a thin asyncio layer around the sessions and the state.

Each connection is a :class:`~tp_store.protocol.ServerSession` (the protocol's
rules, without I/O) applying requests to one shared
:class:`~tp_store.server.state.StoreState`; this module feeds it bytes and writes its
replies, once per turn. Anything malformed closes that connection only, with
a log line. Names are never
resolved on the accept path, so bursts of connections are not stalled by DNS.

The server counts what it does (:meth:`StoreServer.stats`, and the ``STATS``
extension request) and logs on ``tp_store.server`` with structured fields in
``extra``: ``action`` always, and ``peer``, ``endpoint``, ``duration``
(seconds) and ``reason`` where they apply.

Hardening, all configurable on :class:`StoreServer`: TLS (an ``ssl``
context), a shared secret (with one, a connection can do nothing but
VALIDATE, PING and the authentication exchange until it has proved it knows
the secret), at most ``max_connections`` open connections, the memory limits
of :class:`~tp_store.protocol.Limits`, and ``request_timeout``: a request (the
handshake and authentication included) must arrive whole within it from its
first byte, which defeats clients trickling bytes to hold the server's memory
and connection slots. A connection idle between requests, or parked in a WAIT,
is never timed out: rendezvous nodes wait for minutes.

Against many clients at once: each connection is served a bounded batch of
requests per turn of the event loop (no client starves the others by
pipelining), and ``memory_budget`` bounds what all of them hold together
(requests being received, replies not read, parked waits): over it, the
connections holding the most are dropped. Before authenticating, a
connection may send only small handshake and authentication requests, and
its timeout runs whether or not it reads its replies.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import gc
import logging
import math
import resource
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable
from typing import TypeVar, cast

from tp_store.__about__ import __version__
from tp_store.protocol import (
    CONNECTION_REFUSED,
    STATS_SCHEMA,
    AuthRefused,
    Limits,
    Opcode,
    RequestBeforeAuthentication,
    ServerSession,
    ServerStats,
    Turn,
    check_secret,
    encode_u32,
)

from .log_throttle import LogThrottle
from .session_table import SessionTable
from .state import StoreState

log = logging.getLogger("tp_store.server")

#: Listen backlog: a job's nodes connect at once; the kernel caps it at somaxconn.
DEFAULT_BACKLOG = 4096
_MAX_BACKLOG = 2**31 - 1
#: Open connections a server accepts at most by default, open files allowing:
#: a rendezvous node holds its store connection, and a process of nodes its
#: presence session's and its ticks' (torchrun: three per node).
DEFAULT_MAX_CONNECTIONS = 65536
#: Seconds a request may take to arrive whole from its first byte (the TLS
#: handshake too): generous for an 8 MiB value on a slow link.
DEFAULT_REQUEST_TIMEOUT = 30.0
#: Bytes the server holds for its clients at most (requests being received,
#: replies they do not read, parked waits); over it, the biggest holders are dropped.
DEFAULT_MEMORY_BUDGET = 512 * 1024 * 1024
#: At most one log line per this many seconds about refused connections: a
#: flood of connections must not become a flood of log lines.
_REFUSAL_LOG_INTERVAL = 1.0
#: At most this many warnings about bad connections per interval; the rest
#: are counted and summed up in one line.
_BAD_CONNECTION_LOG_LINES = 20
_BAD_CONNECTION_LOG_INTERVAL = 1.0
_REFUSED = encode_u32(CONNECTION_REFUSED)

_T = TypeVar("_T")


def format_endpoint(host: str, port: int) -> str:
    """``host:port``, with brackets around IPv6 addresses."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _Counters:
    """The server's running totals.

    Only the event-loop thread writes them, with plain int increments: no
    lock, and no object built per request but the new ints. A reader on
    another thread may see a value one request old, never a torn one.
    """

    __slots__ = (
        "accepted",
        "auth_failures",
        "bytes_received",
        "bytes_sent",
        "ops",
        "protocol_errors",
        "refused",
        "timed_out",
    )

    def __init__(self) -> None:
        self.accepted = 0
        self.protocol_errors = 0
        self.refused = 0
        self.timed_out = 0
        self.auth_failures = 0
        self.bytes_received = 0
        self.bytes_sent = 0
        #: Requests received, indexed by opcode byte.
        self.ops = [0] * 256


class _Connection(asyncio.Protocol):
    """One client connection: the I/O around its :class:`~tp_store.protocol.ServerSession`.

    It feeds the session what arrives, writes what the session replies (once
    per turn), and keeps what only I/O knows: timeouts, paused writing, the
    bytes held for the memory budget, closing.
    """

    def __init__(self, server: StoreServer) -> None:
        self._server = server
        self._counters = server._counters
        self._session = ServerSession(
            server.state,
            server.limits,
            secret=server.secret,
            stats=server.stats,
            ops=server._counters.ops,
            woken=self._woken,
            sessions=server.sessions,
            expired=self._session_expired,
        )
        self._transport: asyncio.Transport | None = None
        self._peer: str | None = None  # looked up when first logged: most never are
        self._opened = time.monotonic()
        self._close_reason = ""
        self._writing_paused = False
        self._unread = 0  # reply bytes counted in the memory budget since writing paused
        self._counted = 0  # request bytes and parked wait counted in the memory budget
        self._deferred = False  # its turn is over; the rest is served on the next one
        # time.monotonic() when the request being received began (0: none).
        # Until admitted, the connection's opening: the handshake and the
        # authentication must be done within the request timeout too,
        # whether the client reads its replies or not.
        self._partial_since = 0.0
        # Decided when accepted, before a TLS handshake: one that is still
        # going on holds its place against max_connections. Without TLS,
        # decided when made, in the same turn of the loop.
        self._tls = server.ssl is not None
        self._refused = self._tls and server.opening(self)
        self._closed = False

    @property
    def parked(self) -> bool:
        """Whether this connection waits in WAIT, WAIT_GET or BARRIER."""
        return self._session.parked

    def recount(self) -> int:
        """Bytes the server holds for this connection now (its request being
        received, the replies it has not read, its parked wait), as counted in
        the memory budget from now on."""
        transport = self._transport
        if self._writing_paused and transport is not None:
            self._unread = transport.get_write_buffer_size()
        session = self._session
        self._counted = session.buffered + session.pending_bytes
        return self._counted + self._unread

    def _recount_session(self) -> None:
        """Count what the session holds now in the memory budget."""
        session = self._session
        held = session.buffered + session.pending_bytes
        if held != self._counted:
            self._server.hold(held - self._counted)
            self._counted = held

    # -- asyncio callbacks ------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._opened = self._partial_since = time.monotonic()
        server = self._server
        if self._tls:
            server.made(self)
        else:
            self._refused = server.full()
        if self._refused:
            self._server.refuse(self._transport)
            self._transport = None  # nothing it sends is served
            return
        # Both event loops set TCP_NODELAY on the connections they accept.
        self._server.connections.add(self)
        self._counters.accepted += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "connection from %s opened",
                self.peer,
                extra={"action": "connection_open", "peer": self.peer},
            )

    @property
    def peer(self) -> str:
        """The client's ``host:port`` (``?`` if unknown), asked of the transport once."""
        if self._peer is None:
            transport = self._transport
            address = transport.get_extra_info("peername") if transport is not None else None
            self._peer = format_endpoint(str(address[0]), int(address[1])) if address else "?"
        return self._peer

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._server.closing.pop(self, None)
        self._free()
        if log.isEnabledFor(logging.DEBUG):
            duration = time.monotonic() - self._opened
            reason = self._close_reason or (str(exc) if exc else "closed by the client")
            log.debug(
                "connection from %s closed after %.3f s: %s",
                self.peer,
                duration,
                reason,
                extra={
                    "action": "connection_close",
                    "peer": self.peer,
                    "duration": duration,
                    "reason": reason,
                },
            )
        self._transport = None

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        counters = self._counters
        counters.bytes_received += len(data)
        session = self._session
        if session.store_session is not None:  # its silence timer reads the time
            session.store_session.last_frame = time.monotonic()
        transport = self._transport
        if transport is not None and not self._writing_paused:
            # One whole usual request with nothing before it: answered directly.
            try:
                reply = session.answer(data)
            except (ValueError, OverflowError) as exc:  # a bad ADD, or a limit
                self._fail(transport, exc, "protocol_error")
                return
            if reply is not None:
                self._partial_since = 0.0  # nothing is being received now
                if reply:
                    counters.bytes_sent += len(reply)
                    transport.write(reply)
                elif session.pending_bytes != self._counted:  # a wait parked
                    self._recount_session()
                return
        session.receive(data)
        self._serve()

    def pause_writing(self) -> None:
        # The client is not reading its replies: stop reading its requests
        # until it catches up, so its replies cannot pile up in memory. What
        # it leaves unread counts in the memory budget until then.
        self._writing_paused = True
        self._server.unread_by.add(self)
        transport = self._transport
        if transport is not None and not self._closed:
            transport.pause_reading()
            self._unread = transport.get_write_buffer_size()
            self._server.hold(self._unread)

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._server.unread_by.discard(self)
        self._server.hold(-self._unread)
        self._unread = 0
        if self._transport is not None and not self._closed and not self._deferred:
            self._transport.resume_reading()
            self._serve()

    def _serve(self) -> None:
        """Serve the buffered requests until they run out, the client stops
        reading, or its turn is over; their replies go out in one write."""
        transport = self._transport
        if transport is None or self._closed:
            return
        session = self._session
        try:
            turn = session.serve()
            served = session.served
            while True:
                if session.outbox:
                    self._flush(transport)
                if turn is not Turn.FLUSH or self._writing_paused:
                    break
                turn = session.serve()
                served += session.served
        except (RequestBeforeAuthentication, AuthRefused) as exc:
            self._fail(transport, exc, "auth_refused")
            return
        # Not `exc` again: mypyc gives a name one type, its first except clause's.
        except (ValueError, OverflowError) as error:  # ProtocolError, a limit, or a bad ADD
            self._fail(transport, error, "protocol_error")
            return
        if turn is Turn.YIELD:
            self._defer(transport)
        buffered = session.buffered
        if buffered or self._counted or session.pending_bytes:
            self._recount_session()
        if session.admitted:
            # The request timeout runs from the first byte of a request: a
            # client that trickles bytes cannot reset it by sending more.
            if not buffered:
                self._partial_since = 0.0
            elif served or not self._partial_since:
                self._partial_since = time.monotonic()

    def _flush(self, transport: asyncio.Transport) -> None:
        """Write what the session replied, in one go."""
        outbox = self._session.outbox
        data = outbox[0] if len(outbox) == 1 else b"".join(outbox)
        outbox.clear()
        # Counted before it is sent: a client that has read a reply finds it in the totals.
        self._counters.bytes_sent += len(data)
        transport.write(data)

    def _fail(self, transport: asyncio.Transport, exc: Exception, action: str) -> None:
        """Close after a request the session refused; what it replied before goes out first."""
        if self._session.outbox:
            self._flush(transport)
        if action == "auth_refused":
            self._counters.auth_failures += 1
        else:
            self._counters.protocol_errors += 1
        self.close(f"{exc}", action=action)

    def _session_expired(self, reason: str) -> None:
        self.close(reason, logging.INFO, "session_expired")

    def _woken(self, error: Exception | None) -> None:
        """The session's parked wait was answered from another connection's request."""
        transport = self._transport
        if transport is None or self._closed:
            return
        if error is not None:
            self._fail(transport, error, "protocol_error")
            return
        self._flush(transport)
        self._recount_session()

    def _defer(self, transport: asyncio.Transport) -> None:
        """End this connection's turn: the rest of what it sent waits for the next one."""
        self._deferred = True
        transport.pause_reading()
        asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._deferred = False
        transport = self._transport
        if transport is None or self._closed:
            return
        self._serve()
        if not self._deferred and not self._writing_paused:
            transport.resume_reading()

    def stalled(self, since: float) -> bool:
        """Whether the request being received began before ``since`` (never while
        the server holds requests back from an authenticated client that does
        not read: it is paused, not slow)."""
        started = self._partial_since
        return 0.0 < started < since and not (self._writing_paused and self._session.admitted)

    def close(
        self, reason: str, level: int = logging.WARNING, action: str = "protocol_error"
    ) -> None:
        """Drop this connection, logging why (``action`` is the log record's field).

        Its place and what it held are freed at once. What it was sent is
        flushed, unless it has stopped reading: then it is aborted.
        """
        if self._closed:
            return
        if level < logging.WARNING or self._server.bad_connection_log.allow():
            log.log(
                level,
                "closing connection from %s: %s",
                self.peer,
                reason,
                extra={
                    "action": action,
                    "peer": self.peer,
                    "duration": time.monotonic() - self._opened,
                    "reason": reason,
                },
            )
        self._close_reason = reason
        transport = self._transport
        self._free()
        if transport is not None:
            if self._writing_paused:
                transport.abort()
            else:
                transport.close()
                self._server.closing[self] = time.monotonic()

    def abort(self) -> None:
        """Reset a closed connection whose client has not read what it was sent."""
        if self._transport is not None:
            self._transport.abort()

    def _free(self) -> None:
        """Give back its place among the connections and what it holds of the budget."""
        if not self._closed:
            self._closed = True
            self._server.connections.discard(self)
            self._server.unread_by.discard(self)
            self._session.close()
            held = self._counted + self._unread
            if held:
                self._server.hold(-held)
                self._counted = self._unread = 0


def _bind(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets on exactly the addresses ``host`` names (numeric lookup only
    when it is an address; forward lookup for a name), one port for all of them."""
    infos = socket.getaddrinfo(
        host or None,
        port,
        type=socket.SOCK_STREAM,
        flags=socket.AI_PASSIVE | socket.AI_NUMERICSERV,
    )
    addresses = list(dict.fromkeys((info[0], info[4][0]) for info in infos))
    sockets: list[socket.socket] = []
    try:
        for family, address in addresses:
            # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say so.
            sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((address, port))
            port = sock.getsockname()[1]  # the others share the first one's port
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class StoreServer:
    """A TCPStore server on the running asyncio event loop.

    ``host`` is bound as given (an empty string means every interface);
    ``port=0`` picks a free port, readable from :attr:`port` once started.

    Args:
        limits: request and memory limits (a request over one closes its
            connection, with a log line: the protocol has no error reply).
        ssl: serve TLS with this context (see
            :func:`tp_store.security.server_ssl_context`); None: plain TCP.
        secret: require every connection to prove it knows this secret
            before anything but the handshake; None: open to every client.
        max_connections: connections beyond this many open (TLS handshakes
            under way included) are closed as soon as accepted (counted, and
            logged at most once a second). ``None``: as many as the open-file
            limit allows once raised to the hard limit, at most
            :data:`DEFAULT_MAX_CONNECTIONS`.
        request_timeout: seconds a request may take to arrive whole from its
            first byte; also bounds the TLS handshake and, with a secret, the
            time from connecting to being authenticated.
        memory_budget: bytes the server holds for all its clients together at
            most: requests being received, replies a client has stopped
            reading, parked waits. Over it, the connections holding the most
            are dropped, with a log line, until it is met again.
    """

    def __init__(
        self,
        host: str,
        port: int = 0,
        *,
        backlog: int = DEFAULT_BACKLOG,
        limits: Limits | None = None,
        listen_fd: int | None = None,
        ssl: ssl.SSLContext | None = None,
        secret: bytes | None = None,
        max_connections: int | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {port}")
        if not 1 <= backlog <= _MAX_BACKLOG:  # listen(2) takes a C int
            raise ValueError(f"backlog must be in 1..{_MAX_BACKLOG}, got {backlog}")
        if max_connections is not None and (
            isinstance(max_connections, bool)
            or not (isinstance(max_connections, int) and max_connections >= 1)
        ):
            raise ValueError(f"max_connections must be a positive int, got {max_connections!r}")
        if isinstance(request_timeout, bool) or not (
            isinstance(request_timeout, (int, float)) and 0 < request_timeout < math.inf
        ):
            raise ValueError(
                f"request_timeout must be a positive number of seconds, got {request_timeout!r}"
            )
        self.host = host
        self.port = port
        self.backlog = backlog
        self.limits = limits or Limits()
        if isinstance(memory_budget, bool) or not (
            isinstance(memory_budget, int) and memory_budget >= self.limits.max_message_bytes
        ):
            raise ValueError(
                f"memory_budget must be an int of at least max_message_bytes "
                f"({self.limits.max_message_bytes}), got {memory_budget!r}"
            )
        self.memory_budget = memory_budget
        self.ssl = ssl
        self.secret = None if secret is None else check_secret(secret)
        self._fit_open_files = max_connections is None
        self.max_connections = (
            DEFAULT_MAX_CONNECTIONS if max_connections is None else max_connections
        )
        self.request_timeout = float(request_timeout)
        limits = self.limits
        self.state = StoreState(
            limits.max_keys,
            limits.max_value_bytes,
            limits.max_session_keys,
            limits.max_session_wills,
            limits.max_stored_bytes,
        )
        self.sessions = SessionTable(self.state)
        self.connections: set[_Connection] = set()
        #: Connections whose client does not read its replies (writing paused): what
        #: they leave unread changes without a call, so the sweep counts it again.
        self.unread_by: set[_Connection] = set()
        # Accepted, not yet made (a TLS handshake under way): they hold a place
        # against max_connections. Weak: a failed handshake drops its protocol
        # without a call.
        self._opening: weakref.WeakSet[_Connection] = weakref.WeakSet()
        #: Closed connections still flushing, by time.monotonic() of the close.
        self.closing: dict[_Connection, float] = {}
        #: Bytes held for clients, as counted by their connections (see memory_budget).
        self.held = 0
        self._memory_check: asyncio.Handle | None = None
        self._collected = -math.inf  # time.monotonic() of the last gc.collect() for _opening
        self.bad_connection_log = LogThrottle(
            _BAD_CONNECTION_LOG_LINES, _BAD_CONNECTION_LOG_INTERVAL
        )
        self.loop: asyncio.AbstractEventLoop | None = None
        self._listen_fd = listen_fd
        self._servers: list[asyncio.base_events.Server] = []
        self._counters = _Counters()
        self._started: float | None = None  # time.monotonic() when it started listening
        self._sweeper: asyncio.TimerHandle | None = None
        self._refusals_unlogged = 0
        self._refusal_logged = -math.inf  # time.monotonic() of the last refusal log line

    @property
    def endpoint(self) -> str:
        """``host:port`` as clients should dial it."""
        return format_endpoint(self.host or "0.0.0.0", self.port)

    async def start(self) -> None:
        """Bind and start accepting (raises ``OSError`` if the address is taken)."""
        loop = self.loop = asyncio.get_running_loop()
        open_files = raise_open_file_limit(self.max_connections, warn=not self._fit_open_files)
        if self._fit_open_files:
            self.max_connections = max(1, min(self.max_connections, open_files - _SPARE_FILES))
        if self._listen_fd is not None:
            sock = socket.socket(fileno=self._listen_fd)
            sock.listen(self.backlog)
            sock.setblocking(False)
            sockets = [sock]
        else:
            sockets = _bind_with_retry(self.host, self.port, self.backlog)
        self.port = sockets[0].getsockname()[1]
        for sock in sockets:
            # create_server listens again: give it our backlog, not its default of 100.
            server = await loop.create_server(
                lambda: _Connection(self),
                sock=sock,
                backlog=self.backlog,
                ssl=self.ssl,
                ssl_handshake_timeout=self.request_timeout if self.ssl else None,
            )
            self._servers.append(server)
        self._started = time.monotonic()
        self._schedule_sweep()
        log.info(
            "store server listening on %s%s%s",
            self.endpoint,
            " (TLS)" if self.ssl else "",
            " (secret required)" if self.secret else "",
            extra={"action": "server_start", "endpoint": self.endpoint},
        )

    @property
    def _sweep_interval(self) -> float:
        return min(1.0, self.request_timeout / 4)

    def _schedule_sweep(self) -> None:
        # One timer for the whole server, not one per request: the request
        # path only stores a timestamp when a request is left incomplete.
        self._sweeper = asyncio.get_running_loop().call_later(self._sweep_interval, self._sweep)

    def _sweep(self) -> None:
        """Close the connections whose current request is older than the request
        timeout, abort the closed ones that do not read what they were sent, and
        check the memory budget."""
        now = time.monotonic()
        since = now - self.request_timeout
        for connection in [c for c in self.connections if c.stalled(since)]:
            self._counters.timed_out += 1
            connection.close(
                f"request not received whole within {self.request_timeout:g} s",
                action="request_timeout",
            )
        # A close flushes what the client was sent; one that does not read it
        # within a sweep is reset rather than kept open.
        linger = now - self._sweep_interval
        for connection in [c for c, closed in self.closing.items() if closed < linger]:
            del self.closing[connection]
            connection.abort()
        # What connections hold is counted as it changes, but for unread replies.
        if self.unread_by or self.held > self.memory_budget:
            self._check_memory()
        # A handshake is over within the request timeout: a protocol still
        # counted past it was dropped without a call (or is about to be).
        for connection in [c for c in self._opening if c._opened < since]:
            self._opening.discard(connection)
        self.bad_connection_log.flush()
        self._schedule_sweep()

    def full(self) -> bool:
        """Whether ``max_connections`` are open (TLS handshakes under way counted):
        a connection accepted now is refused."""
        if self.ssl is None:  # no handshakes: _opening stays empty (its len() is Python code)
            return len(self.connections) >= self.max_connections
        if len(self.connections) + len(self._opening) < self.max_connections:
            return False
        # asyncio drops the protocol of a failed TLS handshake in a reference
        # cycle: at the limit, collect those (at most once a second) and count again.
        now = time.monotonic()
        if not self._opening or now - self._collected < 1.0:
            return True
        self._collected = now
        gc.collect()
        return len(self.connections) + len(self._opening) >= self.max_connections

    def opening(self, connection: _Connection) -> bool:
        """Count a TLS connection just accepted, its handshake under way; True if it
        is beyond ``max_connections``."""
        if self.full():
            return True
        self._opening.add(connection)
        return False

    def made(self, connection: _Connection) -> None:
        """A connection accepted is ready (its TLS handshake done)."""
        self._opening.discard(connection)

    def hold(self, size: int) -> None:
        """Count ``size`` more bytes held for clients (negative: given back)."""
        self.held += size
        if self.held > self.memory_budget and self._memory_check is None and self.loop:
            self._memory_check = self.loop.call_soon(self._check_memory)

    def _check_memory(self) -> None:
        """Drop the connections holding the most until the memory budget is met."""
        self._memory_check = None
        holders = [(c.recount(), c) for c in self.connections]
        total = self.held = sum(size for size, _ in holders)
        if total <= self.memory_budget:
            return
        holders.sort(key=lambda holder: holder[0], reverse=True)
        for size, connection in holders:
            if total <= self.memory_budget:
                break
            total -= size
            connection.close(
                f"it holds {size} bytes of the server's memory, which is over its budget "
                f"of {self.memory_budget} bytes (request being received, unread replies, "
                "parked wait)",
                action="memory_budget",
            )

    def refuse(self, transport: asyncio.Transport) -> None:
        """Close a connection accepted beyond ``max_connections``, saying so first.

        The :data:`~tp_store.protocol.CONNECTION_REFUSED` marker goes out at
        once, unasked and without reading anything: our client finds it where
        it awaits its handshake PING's answer and reports the connection limit.
        """
        self._counters.refused += 1
        self._refusals_unlogged += 1
        self._counters.bytes_sent += len(_REFUSED)
        transport.write(_REFUSED)
        transport.close()
        now = time.monotonic()
        if now - self._refusal_logged >= _REFUSAL_LOG_INTERVAL:
            peer = transport.get_extra_info("peername")
            log.warning(
                "refused %d connection(s) (the last from %s): %d open, the limit",
                self._refusals_unlogged,
                format_endpoint(str(peer[0]), int(peer[1])) if peer else "?",
                self.max_connections,
                extra={"action": "connection_refused", "reason": "max_connections"},
            )
            self._refusals_unlogged = 0
            self._refusal_logged = now

    @property
    def uptime(self) -> float:
        """Seconds since the server started listening (0 before)."""
        return 0.0 if self._started is None else time.monotonic() - self._started

    def stats(self) -> ServerStats:
        """The server's counters now: what a ``STATS`` request answers.

        Callable from any thread: it reads ints and takes a snapshot of the
        connection set, each atomic under the GIL, so a value may be a request
        old but is never torn.
        """
        counters = self._counters
        connections = list(self.connections)
        ops = counters.ops
        return {
            "schema": STATS_SCHEMA,
            "tp_store_version": __version__,
            "uptime_seconds": self.uptime,
            "connections_open": len(connections),
            "connections_accepted": counters.accepted,
            "connections_protocol_errors": counters.protocol_errors,
            "connections_refused": counters.refused,
            "connections_timed_out": counters.timed_out,
            "connections_auth_failures": counters.auth_failures,
            "waiters_parked": sum(1 for connection in connections if connection.parked),
            "keys": self.state.num_keys(),
            "bytes_received": counters.bytes_received,
            "bytes_sent": counters.bytes_sent,
            "ops": {opcode.name.lower(): ops[opcode] for opcode in Opcode},
            **self.sessions.stats(),
        }

    async def close(self) -> None:
        """Stop accepting and drop every connection."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._memory_check is not None:
            self._memory_check.cancel()
            self._memory_check = None
        for server in self._servers:
            server.close()
        for connection in list(self.connections):
            connection.close("server shutting down", logging.INFO, action="shutdown")
        self.bad_connection_log.flush(final=True)
        for server in self._servers:
            await server.wait_closed()
        if self._servers:
            log.info(
                "store server on %s stopped after %.1f s",
                self.endpoint,
                self.uptime,
                extra={"action": "server_stop", "endpoint": self.endpoint, "duration": self.uptime},
            )
        self._servers.clear()


#: Open files the process needs besides its connections (listeners, logs, the loop).
_SPARE_FILES = 64


def raise_open_file_limit(max_connections: int, *, warn: bool = True) -> int:
    """Raise the soft limit on open files as far as ``max_connections`` need (up to
    the hard limit); with ``warn``, warn when it stays below, as connections past
    it are reset by the kernel with no log line. Returns the soft limit (a large
    number when unlimited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + _SPARE_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft == resource.RLIM_INFINITY:
        return 2**31
    if warn and soft < wanted:
        log.warning(
            "the open-file limit (%d) is below max_connections (%d) plus %d spare: "
            "connections past it will be refused by the system; raise it (ulimit -n)",
            soft,
            max_connections,
            _SPARE_FILES,
            extra={"action": "open_file_limit", "reason": "RLIMIT_NOFILE"},
        )
    return soft


def _bind_with_retry(host: str, port: int, backlog: int) -> list[socket.socket]:
    # With port 0 and several addresses (a name resolving to IPv4 and IPv6),
    # the port picked for the first may be taken on another: pick again.
    for _ in range(10):
        try:
            return _bind(host, port, backlog)
        except OSError as exc:
            if port != 0 or exc.errno != errno.EADDRINUSE:
                raise
    return _bind(host, port, backlog)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop when it is installed (``tp-store[fast]``), else asyncio's."""
    try:
        import uvloop  # noqa: PLC0415 - optional: tp-store[fast]
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class ServerThread:
    """Runs a :class:`StoreServer` on an event loop in a daemon thread.

    This is how ``TCPStore(is_master=True)`` hosts its server in-process.
    """

    def __init__(self, server: StoreServer) -> None:
        self.server = server
        self._loop = new_event_loop()
        # Not `_thread`: mypyc would name its C field `__thread`, a C keyword.
        self._runner = threading.Thread(
            target=self._run, name=f"tp-store-server:{server.port}", daemon=True
        )
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()

    def start(self) -> None:
        """Start the thread and return once the server listens (or raise why it cannot)."""
        self._runner.start()
        self._started.result()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.server.start())
        except BaseException as exc:
            self._started.set_exception(exc)
            self._loop.close()
            return
        self._started.set_result(None)
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self.server.close())
            self._loop.close()

    def call(self, function: Callable[[], _T]) -> _T:
        """Run ``function`` on the server's loop thread and return its result."""
        result: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def run() -> None:
            try:
                result.set_result(function())
            except BaseException as exc:
                result.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return result.result()

    def stop(self) -> None:
        """Close every connection and stop the thread."""
        if self._runner.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop already closed
                self._loop.call_soon_threadsafe(self._loop.stop)
            # Not when garbage collection finalizes a master in the server's own thread.
            if threading.current_thread() is not self._runner:
                self._runner.join()
