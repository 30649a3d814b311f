"""``TCPStore``: PyTorch's TCPStore client (and, for the master, its server).

One TCP connection per store object, shared by threads under a lock. Against
our own server the client negotiates the ``WAIT_GET`` extension during the
handshake PING, which makes ``get`` and ``multi_get`` one round trip; against
a PyTorch server it speaks the plain protocol. The ``STATS`` extension reads
the server's counters (:meth:`TCPStore.server_stats`).

The protocol's rules (the handshake, the authentication, one wait at a time,
each reply's format) are a :class:`~tp_store.protocol.ClientSession`; this
class does the socket I/O around it.

Optionally (both off by default, and both unknown to PyTorch): TLS, and a
shared secret proved in a challenge-response right after the handshake PING
(see :mod:`tp_store.protocol.auth`). With a secret the client refuses any server
that cannot prove the same secret, PyTorch's included.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import select
import socket
import ssl
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TypeVar

from tp_store.base import (
    DEFAULT_TIMEOUT,
    Data,
    Store,
    Timeout,
    UnsupportedOperationError,
    as_bytes,
    as_keys,
)
from tp_store.errors import (
    ProtocolError,
    QueueEmptyError,
    StoreAuthenticationError,
    StoreConnectionError,
    StoreError,
    StoreTimeoutError,
)
from tp_store.protocol import (
    BYTES_REPLY,
    FLAG_REPLY,
    INCOMPLETE,
    Add,
    Append,
    Barrier,
    Check,
    CheckReply,
    ClientSession,
    CompareSet,
    DeleteKey,
    Get,
    GetNumKeys,
    Incomplete,
    ListKeys,
    MultiGet,
    MultiSet,
    Ping,
    QueueLen,
    QueuePop,
    QueuePush,
    ReplyFormat,
    ServerStats,
    Set,
    Stats,
    Wait,
    WaitAny,
    WaitGet,
    WaitReply,
    decode_stats,
)
from tp_store.security import PathLike, TLSConfig, load_secret
from tp_store.semantics import INT64_MAX, INT64_MIN, check_multi_set, int_argument, timeout_error
from tp_store.server.shared_servers import shared_servers, start_server
from tp_store.server.store_server import ServerThread, StoreServer, format_endpoint
from tp_store.sessions.base import StoreSession, session_timeout_seconds
from tp_store.sessions.tcp_session import TCPSession

log = logging.getLogger("tp_store.tcp_store")  # the name users configure, from before stores/

#: The counter PyTorch clients increment when they join a store with a world size.
INIT_KEY = b"init/"
#: Set to a true value by PyTorch's elastic agent when its store serves the workers.
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
_ENV_TRUE = frozenset({"1", "true", "t", "yes", "y"})
_ENV_FALSE = frozenset({"0", "false", "f", "no", "n"})
#: User keys carry this prefix on the server, as PyTorch's client does.
USER_KEY_PREFIX = b"/"

_RECV_SIZE = 1 << 16
#: Each reply is first received into a buffer of this size, held by the store
#: (recv(65536) would allocate 64 KiB, then shrink it, per call); a bigger reply
#: is read on in pieces of ``_RECV_SIZE``. Small, as a process may hold
#: thousands of stores.
_REPLY_SPACE = 4096
# Socket timeouts are kernel options (SO_RCVTIMEO/SO_SNDTIMEO) on a blocking
# socket: one syscall per send or receive, where Python's own socket timeouts
# add a poll() before each. An expired one surfaces as BlockingIOError. TLS
# sockets use Python's timeouts: on a blocking TLS socket, Python retries a
# read that the kernel timed out, forever.
_TIMED_OUT = (TimeoutError, BlockingIOError)
#: QUEUE_POP requests ``queue_pop_many`` sends at once before reading their replies.
_POPS_PER_SEND = 1024
_CONNECT_BACKOFF_INITIAL = 0.01
_CONNECT_BACKOFF_MAX = 1.0
#: A connection idle this long (seconds) is checked before a request goes on it:
#: the store may have closed it meanwhile, and a request sent there would fail
#: or (a SET, which has no reply) be lost. The check (:func:`_closed`) asks the
#: kernel and never waits.
#: With a session attached, half its timeout if that is shorter: the store ends
#: the session of a process stopped past its timeout, and closes its connection.
_IDLE_CHECK_AFTER = 1.0
_monotonic = time.monotonic


_T = TypeVar("_T")


def _dial_host(host: str) -> str:
    """Where a master reaches its own server when it listens on every interface."""
    return {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)


def _timeval(seconds: float) -> bytes:
    # Zero would mean "never time out": the shortest wait is a microsecond.
    micros = max(round(seconds * 1_000_000), 1)
    if sys.platform == "win32":
        return struct.pack("<I", max(micros // 1000, 1))
    return struct.pack("@ll", micros // 1_000_000, micros % 1_000_000)


#: Linux reports a TCP connection's state (``TCP_INFO``'s first byte) without the
#: GIL released, as a poll releases it: in a busy process of many threads every
#: release hands the GIL to another thread, and takes a wait to get it back.
_TCP_INFO = socket.TCP_INFO if sys.platform == "linux" else None
_TCP_ESTABLISHED = 1


def _closed(sock: socket.socket) -> bool:
    """Whether the store closed this idle connection: a FIN or a reset, as the kernel's
    TCP state shows; over TLS (and off Linux), anything to read, since with no
    request out the store sends nothing but its close (TLS's close_notify too)."""
    if _TCP_INFO is not None and not isinstance(sock, ssl.SSLSocket):
        # A FIN or a reset moves the connection out of ESTABLISHED. A kernel that
        # cannot tell (an emulated one) is polled instead.
        try:
            return sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 1)[0] != _TCP_ESTABLISHED
        except OSError:
            pass
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _check_flags(**flags: object) -> None:
    """Refuse a flag that is not a ``bool`` (``"no"`` would be true), naming it."""
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__} {flag!r}")


def _agent_store_serves(port: int) -> bool:
    """Whether PyTorch's elastic agent hosts the store on ``port`` for this process.

    PyTorch's rule: ``TORCHELASTIC_USE_AGENT_STORE`` is true and ``MASTER_PORT``
    is ``port``. Read only when a master's server cannot bind, as PyTorch does.
    """
    flag = os.environ.get(AGENT_STORE_ENV)
    if flag is None:
        return False
    if flag.lower() not in _ENV_TRUE | _ENV_FALSE:
        raise ValueError(f"invalid value {flag!r} for environment variable {AGENT_STORE_ENV}")
    if flag.lower() in _ENV_FALSE or "MASTER_PORT" not in os.environ:
        return False
    try:
        master_port = int(os.environ["MASTER_PORT"].strip())
    except ValueError:
        raise ValueError(
            f"invalid value {os.environ['MASTER_PORT']!r} for environment variable MASTER_PORT"
        ) from None
    return master_port == port


def _user_key(key: Data) -> bytes:
    if type(key) is str:  # the common case, without the type checks
        return USER_KEY_PREFIX + key.encode()
    return USER_KEY_PREFIX + as_bytes(key, "key")


def _user_keys(keys: Sequence[Data]) -> tuple[bytes, ...]:
    return tuple(USER_KEY_PREFIX + key for key in as_keys(keys))


class TCPStore(Store):
    """A store client over TCP, speaking PyTorch's TCPStore protocol.

    Args:
        host_name: the server's host name or address (the address to bind
            when ``is_master``; an empty string binds every interface).
        port: the server's port; with ``is_master``, 0 picks a free one
            (read it back from :attr:`port`).
        world_size: the number of store users; with ``wait_for_workers``
            each client counts itself in and the master waits for all.
        is_master: host the server in this process (a background thread).
        timeout: default timeout of blocking operations and of connecting,
            as a ``timedelta`` or seconds.
        wait_for_workers: whether the master's constructor waits for
            ``world_size`` users to have joined.
        multi_tenant: masters in this process on the same port share one server.
        master_listen_fd: an already listening socket for the master's server.
        use_libuv: accepted for compatibility with PyTorch (our server is
            asyncio either way) and reported back by :attr:`libuvBackend`.
        tls_cert: PEM certificate (chain): the master's server serves TLS with
            it; a client presents it to servers that require client certificates.
        tls_key: PEM private key of ``tls_cert`` (omit if ``tls_cert`` holds it).
        tls_ca: PEM CA file: a client uses TLS and accepts only a server
            certificate it signed, for the host name dialled. A master without
            it trusts exactly its own ``tls_cert``.
        tls_client_ca: master only: require client certificates signed by
            this CA (mutual TLS).
        secret: the shared secret (bytes) proved to the server, and required
            of every client by the master's server.
        secret_file: a file holding the secret instead. Without either, the
            environment's ``TP_STORE_SECRET`` or ``TP_STORE_SECRET_FILE``
            (see :mod:`tp_store.security`); with none, no authentication.

    A client with a secret refuses a server without one
    (:class:`~tp_store.errors.StoreAuthenticationError`): a misconfiguration
    must not silently leave the store open.

    Under PyTorch's elastic agent (``TORCHELASTIC_USE_AGENT_STORE`` true and
    ``MASTER_PORT`` equal to ``port``), a master whose server cannot bind
    becomes a client of the agent's store, as PyTorch's does, instead of
    failing with "address already in use".
    """

    def __init__(  # noqa: PLR0917 - PyTorch's positional signature
        self,
        host_name: str,
        port: int,
        world_size: int | None = None,
        is_master: bool = False,
        timeout: Timeout = DEFAULT_TIMEOUT,
        wait_for_workers: bool = True,
        multi_tenant: bool = False,
        master_listen_fd: int | None = None,
        use_libuv: bool = True,
        *,
        tls_cert: PathLike | None = None,
        tls_key: PathLike | None = None,
        tls_ca: PathLike | None = None,
        tls_client_ca: PathLike | None = None,
        secret: bytes | None = None,
        secret_file: PathLike | None = None,
    ) -> None:
        super().__init__(timeout)
        if not isinstance(host_name, str):
            raise TypeError(f"host_name must be a str, got {type(host_name).__name__}")
        port = int_argument(port, "port", 0, 65535)
        if world_size is not None:
            world_size = int_argument(world_size, "world_size", 1, INT64_MAX)
        if master_listen_fd is not None:
            master_listen_fd = int_argument(master_listen_fd, "master_listen_fd", 0, 2**31 - 1)
        _check_flags(
            is_master=is_master,
            wait_for_workers=wait_for_workers,
            multi_tenant=multi_tenant,
            use_libuv=use_libuv,
        )
        if port == 0 and not is_master:
            raise ValueError("port 0 is only valid for the master (it picks a free port)")
        self._host = host_name
        self._port = port
        self._world_size = world_size
        self._use_libuv = bool(use_libuv)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._reconnects = True  # a store session's connection never does
        #: Connections made so far: a session attached to one ends with it.
        self.connections_made = 0
        self._attached_session: TCPSession | None = None
        self._recv_timeout = 0.0
        #: When the connection last carried a request or a reply, and how long it
        #: may then lie idle before the next request checks it.
        self._used = 0.0
        self._idle_limit = _IDLE_CHECK_AFTER
        #: When a call's connect attempt last failed, and its message: the calls
        #: that waited for the connection meanwhile fail with it, instead of each
        #: retrying for another store timeout.
        self._connect_failed_at = -1.0
        self._connect_failure = ""
        self._server: ServerThread | None = None
        self._stop_server: Callable[[], object] | None = None  # by close
        self._server_finalizer: weakref.finalize[..., TCPStore] | None = None
        self._tls = TLSConfig(tls_cert, tls_key, tls_ca, tls_client_ca)
        self._secret = load_secret(secret, secret_file)
        self._ssl_context = self._client_ssl_context(is_master)
        if is_master:
            self._start_server(multi_tenant, master_listen_fd)
        # Made once the port is known (a master's may have been picked).
        self._session = ClientSession(self._host, self._port, self._secret)
        self._replies = self._session.replies  # one buffer for the session's life
        self._limits = self._replies.limits
        self._space = bytearray(_REPLY_SPACE)
        with self._lock:
            self._connect()
        if world_size is not None and wait_for_workers:
            self._request(Add.frame(INIT_KEY, 1), Add.reply)
            if self.server is not None:  # a master under the elastic agent has none
                self._wait_for_workers(world_size)

    # -- properties ---------------------------------------------------------------
    @property
    def attached_session(self) -> TCPSession | None:
        """The session attached to this handle's connection: while it lives, no
        wait stays parked longer than a third of its timeout without a frame."""
        return self._attached_session

    @attached_session.setter
    def attached_session(self, session: TCPSession | None) -> None:
        self._attached_session = session
        self._idle_limit = (
            _IDLE_CHECK_AFTER if session is None else min(_IDLE_CHECK_AFTER, session.timeout / 2)
        )

    @property
    def host(self) -> str:
        """The host name this store was created with."""
        return self._host

    @property
    def port(self) -> int:
        """The server's port (the one picked when 0 was asked)."""
        return self._port

    @property
    def endpoint(self) -> str:
        """``host:port`` of the server."""
        return format_endpoint(self._host, self._port)

    @property
    def libuvBackend(self) -> bool:
        """The ``use_libuv`` flag this store was created with, as PyTorch reports it."""
        return self._use_libuv

    @property
    def uses_extensions(self) -> bool:
        """Whether the server is ours and accepted the protocol extensions."""
        return self._session.extended

    @property
    def server(self) -> StoreServer | None:
        """The server this master hosts in-process, if any."""
        return self._server.server if self._server else None

    @property
    def uses_tls(self) -> bool:
        """Whether the connection to the server is TLS."""
        return self._ssl_context is not None

    # -- the master's server -------------------------------------------------------
    def _client_ssl_context(self, is_master: bool) -> ssl.SSLContext | None:
        """How this store's connection does TLS (None: plain TCP); ``ValueError`` if
        the TLS options cannot work for its role."""
        tls = self._tls
        if is_master:
            if tls.ca is not None and tls.cert is None:
                raise ValueError("a master needs tls_cert (and tls_key) to serve TLS")
            return tls.own_server_context() if tls.cert is not None else None
        if tls.client_ca is not None:
            raise ValueError("tls_client_ca is a master's option (it hosts the server)")
        if tls.cert is not None and tls.ca is None:
            raise ValueError(
                "a TLS client needs tls_ca, the CA that signed the server's certificate"
            )
        return tls.client_context() if tls.ca is not None else None

    def _start_server(self, multi_tenant: bool, listen_fd: int | None) -> None:
        security = (self._tls, self._secret)
        finalizer: weakref.finalize[..., TCPStore]
        try:
            if multi_tenant:
                thread = shared_servers.acquire(self._host, self._port, listen_fd, security)
                self._stop_server = functools.partial(shared_servers.release, thread)
                finalizer = weakref.finalize(self, shared_servers.abandon, thread)
            else:
                thread = start_server(self._host, self._port, listen_fd, security)
                self._stop_server = thread.stop
                finalizer = weakref.finalize(self, thread.stop)
            self._server_finalizer = finalizer
        except OSError as exc:
            if _agent_store_serves(self._port):
                log.warning(
                    "the store server on %s cannot bind (%s); %s is set, so this master "
                    "uses the elastic agent's store there",
                    self.endpoint,
                    exc,
                    AGENT_STORE_ENV,
                )
                return
            raise StoreConnectionError(
                f"cannot start the store server on {self.endpoint}: {exc}", self._host, self._port
            ) from exc
        self._server = thread
        self._port = thread.server.port

    def _wait_for_workers(self, world_size: int) -> None:
        assert self._server is not None
        joined = threading.Event()
        seen = [0]

        def on_init(value: bytes) -> bool:
            seen[0] = int(value)
            if seen[0] >= world_size:
                joined.set()
                return True
            return False

        state = self._server.server.state
        self._server.call(lambda: state.watch(INIT_KEY, on_init))
        if not joined.wait(self._timeout_seconds):
            raise StoreTimeoutError(
                f"timed out after {self.timeout} waiting for {world_size} store users on "
                f"{self.endpoint}; {seen[0]} joined",
                [INIT_KEY.decode()],
            )

    # -- connection -----------------------------------------------------------------
    def _connect(self) -> None:
        """Connect and handshake, retrying with backoff until the timeout (lock held)."""
        deadline = time.monotonic() + self._timeout_seconds
        delay = _CONNECT_BACKOFF_INITIAL
        host = _dial_host(self._host)
        while True:
            remaining = deadline - time.monotonic()
            try:
                tcp = socket.create_connection((host, self._port), timeout=max(remaining, 0.001))
            except OSError as exc:
                if remaining <= delay:
                    raise StoreConnectionError(
                        f"cannot connect to the store at {self.endpoint}: timed out after "
                        f"{self.timeout} of retries: {exc}",
                        self._host,
                        self._port,
                    ) from exc
                time.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, _CONNECT_BACKOFF_MAX)
                continue
            break
        tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = tcp if self._ssl_context is None else self._tls_handshake(tcp, host)
        store_timeout = self._timeout_seconds
        if isinstance(sock, ssl.SSLSocket):
            sock.settimeout(store_timeout)
        else:
            sock.settimeout(None)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(store_timeout))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(store_timeout))
        self._recv_timeout = store_timeout
        self._sock = sock
        self._used = _monotonic()
        self.connections_made += 1
        session = self._session
        try:
            sock.sendall(session.hello())
            answer = self._receive(sock, Ping.reply)
        except (OSError, ProtocolError) as exc:
            self._disconnect()
            # A server closes here when it is at its connection limit (ours
            # says so first, see ClientSession.answered, but its word can be
            # lost: a store of another make, or the connection reset before it
            # was read) or when it wants TLS (or a client certificate) that
            # this client lacks.
            tls = (
                "does it require a client certificate (tls_cert, tls_key)?"
                if self.uses_tls
                else "does it require TLS (tls_ca)?"
            )
            raise StoreConnectionError(
                f"the store at {self.endpoint} closed the connection during the handshake "
                f"({exc}); is it at its connection limit (max_connections), or {tls}",
                self._host,
                self._port,
            ) from exc
        try:
            challenge = session.answered(answer)
        except StoreConnectionError:
            self._disconnect()
            raise
        if challenge is not None:
            self._authenticate(challenge)

    def _tls_handshake(self, sock: socket.socket, host: str) -> ssl.SSLSocket:
        """``sock`` wrapped in TLS, the server verified; never retried (lock held)."""
        assert self._ssl_context is not None
        try:
            return self._ssl_context.wrap_socket(sock, server_hostname=host)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            sock.close()
            raise StoreConnectionError(
                f"TLS handshake with the store at {self.endpoint} failed: {exc} "
                "(is it serving TLS, with a certificate the CA signed for this host?)",
                self._host,
                self._port,
            ) from exc

    def _authenticate(self, challenge: bytes) -> None:
        """Prove the secret and check the server's proof (lock held)."""
        sock = self._sock
        assert sock is not None
        session = self._session
        try:
            sock.sendall(challenge)
            sock.sendall(session.prove(self._receive(sock, BYTES_REPLY)))
            session.verify(self._receive(sock, BYTES_REPLY))
        except StoreAuthenticationError as exc:
            self._disconnect()
            raise StoreAuthenticationError(
                f"cannot authenticate to the store at {self.endpoint}: {exc}",
                self._host,
                self._port,
            ) from exc
        except (OSError, ProtocolError) as exc:
            raise self._broken(exc, "authentication") from exc

    def _disconnect(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._session.closed()

    def _ready(
        self, recv_timeout: float, started: float, connection: int | None = None
    ) -> socket.socket:
        """The socket for a request that began at ``started`` (lock held): the
        connection as it is while in use, else checked by :meth:`_socket`."""
        sock = self._sock
        if (
            sock is None
            or recv_timeout != self._recv_timeout
            or started - self._used > self._idle_limit
            or connection is not None
        ):
            sock = self._socket(recv_timeout, started, connection)
        return sock

    def _socket(
        self, recv_timeout: float, started: float, connection: int | None = None
    ) -> socket.socket:
        """The connected socket, receiving within ``recv_timeout`` (lock held).

        Reconnects if the connection was lost, or if the store closed it while
        it was idle. ``started``: when the calling request began (it may have
        waited for the lock while another call tried to connect).
        ``connection``: the request belongs on that connection only (a
        session's), and fails rather than go on another.
        """
        sock = self._sock
        if sock is not None and started - self._used > self._idle_limit and _closed(sock):
            self._disconnect()
            sock = None
        if connection is not None and (sock is None or connection != self.connections_made):
            raise StoreConnectionError(
                f"the connection to the store at {self.endpoint} was lost",
                self._host,
                self._port,
            )
        if sock is None:
            sock = self._reconnect(started)
        self._set_recv_timeout(sock, recv_timeout)
        return sock

    def _reconnect(self, started: float) -> socket.socket:
        """Connect again for a request that began at ``started`` (lock held)."""
        if not self._reconnects:
            raise StoreConnectionError(
                f"the connection to the store at {self.endpoint} is closed",
                self._host,
                self._port,
            )
        if self._connect_failed_at > started:
            # Another call's attempt failed while this one waited for the lock:
            # one store timeout of retries answers both.
            raise StoreConnectionError(self._connect_failure, self._host, self._port)
        try:
            self._connect()
        except StoreConnectionError as exc:
            self._connect_failed_at = _monotonic()
            self._connect_failure = str(exc)
            raise
        assert self._sock is not None
        return self._sock

    def _set_recv_timeout(self, sock: socket.socket, recv_timeout: float) -> None:
        if recv_timeout != self._recv_timeout:
            if isinstance(sock, ssl.SSLSocket):
                sock.settimeout(max(recv_timeout, 1e-6))  # 0 would mean non-blocking
            else:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(recv_timeout))
            self._recv_timeout = recv_timeout

    def _receive(self, sock: socket.socket, reply: ReplyFormat[_T], count: int = 0) -> _T:
        """Read one reply in ``reply``'s format (lock held; socket timeouts propagate)."""
        replies = self._replies
        value: _T | Incomplete
        if replies.pending or not reply.min_size:  # a reply may be empty: no receive first
            value = replies.read(reply, count)
        else:
            # Nothing buffered, as a rule, and the reply arrives whole in one receive.
            space = self._space
            size = sock.recv_into(space)
            value = reply.whole(space, size, count, self._limits)
            if value is not INCOMPLETE:
                return value
            if not size:
                raise ConnectionResetError("the store closed the connection")
            value = replies.received(bytes(space[:size]), reply, count)
        while value is INCOMPLETE:
            data = sock.recv(_RECV_SIZE)
            if not data:
                raise ConnectionResetError("the store closed the connection")
            value = replies.received(data, reply, count)
        return value

    def _broken(self, exc: BaseException, what: str) -> StoreConnectionError:
        self._disconnect()
        return StoreConnectionError(
            f"lost the connection to the store at {self.endpoint} during {what}: {exc} (a "
            "server closes the connection of a request past its limits, such as max_keys or "
            "max_stored_bytes, and logs which: this or an earlier write may have been refused)",
            self._host,
            self._port,
        )

    # The calls below take the lock with acquire() and release() in a
    # try/finally: a with block looks up __enter__ and __exit__ on every call.
    def _send(self, payload: bytes, connection: int | None = None) -> None:
        """Send a request that has no reply (``connection``: as :meth:`_socket`)."""
        started = _monotonic()
        lock = self._lock
        lock.acquire()
        try:
            sock = self._ready(self._timeout_seconds, started, connection)
            try:
                sock.sendall(payload)
            except OSError as exc:
                raise self._broken(exc, "a request") from exc
            self._used = _monotonic()
        finally:
            lock.release()

    def _request(
        self,
        payload: bytes,
        reply: ReplyFormat[_T],
        count: int = 0,
        connection: int | None = None,
    ) -> _T:
        """Send a request and read its reply, within the store timeout
        (``connection``: as :meth:`_socket`)."""
        started = _monotonic()
        self._lock.acquire()
        return self._request_locked(payload, reply, count, started, connection)

    def _request_unless_busy(
        self, payload: bytes, reply: ReplyFormat[_T], connection: int | None = None
    ) -> _T | None:
        """:meth:`_request`, or ``None`` at once while another call uses the connection."""
        started = _monotonic()
        if not self._lock.acquire(blocking=False):
            return None
        return self._request_locked(payload, reply, 0, started, connection)

    def _request_locked(
        self,
        payload: bytes,
        reply: ReplyFormat[_T],
        count: int,
        started: float,
        connection: int | None,
    ) -> _T:
        """:meth:`_request` with the lock just taken (released here)."""
        lock = self._lock
        try:
            sock = self._ready(self._timeout_seconds, started, connection)
            try:
                sock.sendall(payload)
                value = self._receive(sock, reply, count)
            except _TIMED_OUT as exc:
                self._disconnect()
                raise StoreTimeoutError(
                    f"timed out: no reply from the store at {self.endpoint} within {self.timeout}"
                ) from exc
            except (OSError, ProtocolError) as exc:
                raise self._broken(exc, "a request") from exc
            self._used = _monotonic()
            return value
        finally:
            lock.release()

    def _blocking(
        self,
        payload: bytes,
        reply: ReplyFormat[_T],
        count: int,
        timeout: float,
        keys: Sequence[Data],
    ) -> _T:
        """A request the server may park (WAIT, WAIT_GET, WAIT_ANY, BARRIER), cancelled
        on timeout.

        With a session attached to this connection, a WAIT_KEEPALIVE goes out
        at least every third of the session's timeout while the request is
        parked: its frames keep the session alive while its process runs (a
        stopped process sends none, and its session expires), and the wait
        stays parked.
        """
        started = _monotonic()
        lock = self._lock
        lock.acquire()
        try:
            answered = self._park(payload, reply, count, started, keys=keys, asked=timeout)
        finally:
            lock.release()
        if answered is None:
            raise timeout_error([as_bytes(key, "key") for key in keys], timeout)
        return answered

    def _slice(self, left: float) -> float:
        """How long a parked request waits for its reply before the next frame, with
        ``left`` seconds to go."""
        attached = self.attached_session
        return left if attached is None else min(left, attached.timeout / 3)

    def _park(
        self,
        payload: bytes,
        reply: ReplyFormat[_T],
        count: int,
        started: float,
        *,
        keys: Sequence[Data],
        asked: float,
    ) -> _T | None:
        """Send a request the server may park; its reply, or None once ``asked``
        seconds passed and the request was cancelled (lock held; ``started``: as
        :meth:`_socket`)."""
        deadline = started + asked
        sock = self._ready(self._slice(asked), started)
        session = self._session
        try:
            sock.sendall(payload)
            session.parked()
            while True:
                try:
                    value = self._receive(sock, reply, count)
                    break
                except _TIMED_OUT:
                    left = deadline - _monotonic()
                    if left <= 0:
                        raise
                    sock.sendall(session.keep_waiting())
                    self._set_recv_timeout(sock, self._slice(left))
            session.woken()
            self._used = _monotonic()
            return value
        except _TIMED_OUT:
            pass
        except (OSError, ProtocolError) as exc:
            raise self._broken(exc, "a wait") from exc
        try:
            answered = self._cancel_wait(sock, reply, count)
        except _TIMED_OUT as exc:
            # No answer to the cancel within the store timeout (an overloaded
            # or stopped server): the wait timed out, as asked. The replies
            # are out of step now, so the next call reconnects.
            self._disconnect()
            raise timeout_error([as_bytes(key, "key") for key in keys], asked) from exc
        except (OSError, ProtocolError) as exc:
            raise self._broken(exc, "cancelling a wait") from exc
        self._used = _monotonic()
        return answered

    def _cancel_wait(self, sock: socket.socket, reply: ReplyFormat[_T], count: int) -> _T | None:
        """Cancel the parked wait; its reply if it was satisfied meanwhile, else None."""
        # The wait's own reply may be under way when CANCEL_WAIT arrives; then
        # both replies come, the wait's first.
        self._set_recv_timeout(sock, self._timeout_seconds)
        sock.sendall(self._session.cancel())
        first = self._receive(sock, reply, count)
        if reply.status(first) != WaitReply.STOP_WAITING:
            return None
        self._receive(sock, FLAG_REPLY)  # then the WAIT_CANCELED
        return first

    # -- the Store interface ------------------------------------------------------
    def set(self, key: Data, value: Data) -> None:
        self._send(Set.frame(_user_key(key), as_bytes(value)))

    def get(self, key: Data) -> bytes:
        return self._get(key, self._timeout_seconds)

    def wait_get(self, key: Data, timeout: Timeout | None = None) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` for it: one round trip on our server."""
        return self._get(key, self._deadline_seconds(timeout))

    def _get(self, key: Data, seconds: float) -> bytes:
        user_key = _user_key(key)
        if self._session.extended:
            frame = WaitGet.frame((user_key,))
            _, values = self._blocking(frame, WaitGet.reply, 1, seconds, [key])
            if values is None:
                raise self._cancelled_unasked()
            return values[0]
        # A PyTorch server: WAIT, then GET (as PyTorch's client does).
        self._blocking(Wait.frame((user_key,)), Wait.reply, 0, seconds, [key])
        return self._request(Get.frame(user_key), Get.reply)

    def _cancelled_unasked(self) -> StoreConnectionError:
        """A WAIT_GET's reply was WAIT_CANCELED though this client cancelled nothing."""
        self._disconnect()
        return StoreConnectionError(
            f"the store at {self.endpoint} cancelled a wait this client did not cancel",
            self._host,
            self._port,
        )

    def add(self, key: Data, amount: int) -> int:
        if type(amount) is not int or not INT64_MIN <= amount <= INT64_MAX:
            amount = int_argument(amount, "amount")  # the wire's i64
        return self._request(Add.frame(_user_key(key), amount), Add.reply)

    def compare_set(self, key: Data, expected: Data, desired: Data) -> bytes:
        frame = CompareSet.frame(_user_key(key), as_bytes(expected), as_bytes(desired))
        return self._request(frame, CompareSet.reply)

    def wait(self, keys: Sequence[Data], timeout: Timeout | None = None) -> None:
        frame = Wait.frame(_user_keys(keys))
        self._blocking(frame, Wait.reply, 0, self._deadline_seconds(timeout), keys)

    def wait_any(self, keys: Sequence[Data], timeout: Timeout | None = None) -> tuple[int, bytes]:
        user_keys = _user_keys(keys)
        if not user_keys:
            raise ValueError("wait_any needs at least one key")
        if not self._session.extended:
            raise UnsupportedOperationError(
                f"the store at {self.endpoint} is not a tp-store server: it has no wait_any"
            )
        seconds = self._deadline_seconds(timeout)
        frame = WaitAny(user_keys).encode()
        _, values = self._blocking(frame, WaitAny.reply, 2, seconds, keys)
        if values is None:
            raise self._cancelled_unasked()
        index, value = values
        if not index.isdigit() or int(index) >= len(user_keys):
            self._disconnect()
            raise StoreConnectionError(
                f"the store at {self.endpoint} answered a wait for {len(user_keys)} keys "
                f"with the index {index[:32]!r}",
                self._host,
                self._port,
            )
        return int(index), value

    def check(self, keys: Sequence[Data]) -> bool:
        request = Check(_user_keys(keys))
        return self._request(request.encode(), Check.reply) == CheckReply.READY

    def delete_key(self, key: Data) -> bool:
        return self._request(DeleteKey(_user_key(key)).encode(), DeleteKey.reply) == 1

    def num_keys(self) -> int:
        return self._request(GetNumKeys().encode(), GetNumKeys.reply)

    def append(self, key: Data, value: Data) -> None:
        self._send(Append(_user_key(key), as_bytes(value)).encode())

    def multi_get(self, keys: Sequence[Data]) -> list[bytes]:
        user_keys = _user_keys(keys)
        if self._session.extended:
            frame = WaitGet.frame(user_keys)
            timeout = self._timeout_seconds
            _, values = self._blocking(frame, WaitGet.reply, len(user_keys), timeout, keys)
            if values is None:
                raise self._cancelled_unasked()
            return values
        self.wait(keys)
        return self._request(MultiGet(user_keys).encode(), MultiGet.reply, len(user_keys))

    def multi_set(self, keys: Sequence[Data], values: Sequence[Data]) -> None:
        check_multi_set(keys, values)
        items = tuple((_user_key(k), as_bytes(v)) for k, v in zip(keys, values, strict=True))
        self._send(MultiSet(items).encode())

    def list_keys(self) -> list[str]:
        keys = self._request(ListKeys().encode(), ListKeys.reply)
        skip = len(USER_KEY_PREFIX)
        return [
            key[skip:].decode(errors="surrogateescape")
            for key in keys
            if key.startswith(USER_KEY_PREFIX)
        ]

    def queue_push(self, key: Data, value: Data) -> None:
        self._send(QueuePush(_user_key(key), as_bytes(value)).encode())

    def queue_pop(self, key: Data, block: bool = True) -> bytes:
        request = QueuePop(_user_key(key)).encode()
        deadline = time.monotonic() + self._timeout_seconds
        while True:
            if block:
                self.wait([key], max(deadline - time.monotonic(), 0.0))
            _, value = self._request(request, QueuePop.reply)
            if value is not None:
                return value
            if not block:
                raise QueueEmptyError(f"the queue {key!r} is empty")
            # Another popper took the value between our WAIT and POP: wait again.

    def queue_pop_many(self, key: Data, count: int) -> list[bytes]:
        """Up to ``count`` of the oldest values of the queue, without waiting.

        The pops are pipelined: up to :data:`_POPS_PER_SEND` requests go in
        one send and their replies are read after, so draining a queue costs
        a round trip per thousand values, not one per value.
        """
        count = int_argument(count, "count", 0)
        request = QueuePop(_user_key(key)).encode()
        values: list[bytes] = []
        started = _monotonic()
        with self._lock:
            while len(values) < count:
                asked = min(count - len(values), _POPS_PER_SEND)
                sock = self._ready(self._timeout_seconds, started)
                try:
                    sock.sendall(request * asked)
                    replies = [self._receive(sock, QueuePop.reply) for _ in range(asked)]
                except _TIMED_OUT as exc:
                    self._disconnect()
                    raise StoreTimeoutError(
                        f"timed out: no reply from the store at {self.endpoint} within "
                        f"{self.timeout}"
                    ) from exc
                except (OSError, ProtocolError) as exc:
                    raise self._broken(exc, "a request") from exc
                self._used = _monotonic()
                popped = [value for _, value in replies if value is not None]
                values += popped
                if len(popped) < asked:
                    break
        return values

    def queue_len(self, key: Data) -> int:
        return self._request(QueueLen(_user_key(key)).encode(), QueueLen.reply)

    def barrier(self, key: Data, world_size: int, timeout: Timeout | None = None) -> None:
        world_size = int_argument(world_size, "world_size", 1, INT64_MAX)
        request = Barrier(_user_key(key), world_size).encode()
        self._blocking(request, Barrier.reply, 0, self._deadline_seconds(timeout), [key])

    def server_stats(self) -> ServerStats:
        """The server's counters (see :class:`~tp_store.protocol.ServerStats`), in one round trip.

        Raises :class:`~tp_store.UnsupportedOperationError` when the server is
        PyTorch's (it did not accept the protocol extensions), and
        :class:`~tp_store.StoreError` when the answer is not a valid document.
        """
        if not self._session.extended:
            raise UnsupportedOperationError(
                f"the server at {self.endpoint} does not support statistics (not a tp-store server)"
            )
        document = self._request(Stats().encode(), Stats.reply)
        try:
            return decode_stats(document)
        except ProtocolError as exc:
            raise StoreError(f"the server at {self.endpoint} sent bad statistics: {exc}") from exc

    def open_session(self, timeout: Timeout) -> StoreSession:
        """A store session (see :class:`~tp_store.StoreSession`) on a connection of its
        own, made as :meth:`clone` makes one (same TLS and secret).

        ``keep_alive`` is a PING on that connection; the server ends the session
        when the connection closes or after ``timeout`` without a frame on it.
        Raises :class:`~tp_store.UnsupportedOperationError` at once when the
        server is PyTorch's (it did not accept the protocol extensions).
        """
        seconds = self._session_seconds(timeout)
        link = self.clone()
        link._reconnects = False
        return TCPSession(link, seconds, USER_KEY_PREFIX)

    def attach_session(self, timeout: Timeout) -> StoreSession:
        """A store session on this handle's own connection: no connection more.

        The session ends when this connection does (a reconnection does not
        carry it over: later calls on the session raise
        :class:`~tp_store.SessionExpiredError`). Every frame on the connection
        keeps the session alive; a parked wait sends a ``WAIT_KEEPALIVE`` at
        least every third of the session's timeout, so a wait never silences
        it. ``keep_alive`` skips its PING while another call uses the
        connection (that call's frames keep the session alive). Raises
        :class:`~tp_store.UnsupportedOperationError` on PyTorch's server.
        """
        seconds = self._session_seconds(timeout)
        return TCPSession(self, seconds, USER_KEY_PREFIX, attached=True)

    def _session_seconds(self, timeout: Timeout) -> float:
        seconds = session_timeout_seconds(timeout)
        # The extensions are negotiated per connection: read under the lock, once
        # connected (another thread may be reconnecting: mid-handshake they read as
        # not offered).
        started = _monotonic()
        with self._lock:
            if self._reconnects:
                self._socket(self._timeout_seconds, started)
            extended = self._session.extended
        if not extended:
            raise UnsupportedOperationError(
                f"the server at {self.endpoint} does not offer store sessions "
                "(not a tp-store server)"
            )
        return seconds

    def clone(self) -> TCPStore:
        """A new client connection to the same server (never a master), with the same
        TLS files and secret."""
        tls = self._tls
        if self._server is not None and tls.ca is None and tls.cert is not None:
            # The master's pinned own certificate becomes the clone's CA.
            tls = TLSConfig(tls.cert, tls.key, tls.cert)
        return TCPStore(
            self._host,
            self._port,
            timeout=self.timeout,
            tls_cert=tls.cert,
            tls_key=tls.key,
            tls_ca=tls.ca,
            secret=self._secret,
        )

    def close(self) -> None:
        """Close the connection; a master also stops its server (unless shared)."""
        with self._lock:
            self._disconnect()
        finalizer = self._server_finalizer
        if finalizer is not None and finalizer.detach() is not None:  # not closed yet
            assert self._stop_server is not None
            self._stop_server()

    def __repr__(self) -> str:
        role = "master" if self._server else "client"
        return f"TCPStore({self.endpoint}, {role}, pid={os.getpid()})"
