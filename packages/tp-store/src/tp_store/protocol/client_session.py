"""The client's side of one connection, without I/O.

A :class:`ClientSession` writes the handshake, reads its answer, runs the
authentication exchange and then frames replies for the requests the I/O
layer (:class:`~tp_store.TCPStore`) sends, in the format each request
declares, so every call gets a typed value. It tracks the connection's
phase with the same table as the server (:mod:`tp_store.protocol.phases`):
a request is sent only while SERVING, and only CANCEL_WAIT (or, to our
servers, WAIT_KEEPALIVE) while WAITING.
"""

from __future__ import annotations

from typing import Final, TypeVar

from tp_store.errors import ProtocolError, StoreAuthenticationError, StoreConnectionError

from .auth import ClientAuthenticator
from .limits import Limits
from .messages import (
    CONNECTION_REFUSED,
    EXTENSION_ACCEPT,
    EXTENSION_ACCEPT_AUTH,
    EXTENSION_OFFER,
    CancelWait,
    Ping,
    Validate,
    WaitKeepAlive,
)
from .phases import Event, Phase, advance
from .replies import Incomplete, ReplyBuffer, ReplyFormat

_T = TypeVar("_T")

# Every wait's two moves, read from the table once: enum members hash in
# Python, and a get makes both moves on a PyTorch server.
_SERVING: Final = Phase.SERVING
_WAITING: Final = advance(_SERVING, Event.PARKED)
_WOKEN: Final = advance(_WAITING, Event.WOKEN)

#: The handshake our client opens every connection with: VALIDATE, then a
#: PING that offers the extensions (a PyTorch server just echoes it).
HELLO: Final = Validate().encode() + Ping(EXTENSION_OFFER).encode()
#: CANCEL_WAIT, encoded once.
CANCEL_WAIT: Final = CancelWait().encode()
#: WAIT_KEEPALIVE, encoded once.
WAIT_KEEPALIVE: Final = WaitKeepAlive().encode()


class ClientSession:
    """One connection's protocol state on the client side.

    ``host`` and ``port`` name the server in error messages; ``secret``, if
    given, must be proved to the server (and the server must prove it back).
    Failures raise :class:`~tp_store.errors.StoreConnectionError` or
    :class:`~tp_store.errors.StoreAuthenticationError`.
    """

    __slots__ = ("_auth", "_host", "_port", "_replies", "_secret", "extended", "phase")

    def __init__(
        self, host: str, port: int, secret: bytes | None, limits: Limits | None = None
    ) -> None:
        self._host = host
        self._port = port
        self._secret = secret
        self._replies = ReplyBuffer(limits)
        self._auth: ClientAuthenticator | None = None
        self.phase = Phase.CLOSED
        #: Whether the server is ours and accepted the protocol extensions.
        self.extended = False

    @property
    def _endpoint(self) -> str:
        host = self._host
        return f"[{host}]:{self._port}" if ":" in host else f"{host}:{self._port}"

    # -- bytes in, replies out ------------------------------------------------------
    def receive(self, data: bytes) -> None:
        """Add bytes received from the server."""
        self._replies.feed(data)

    def read(self, reply: ReplyFormat[_T], count: int = 0) -> _T | Incomplete:
        """The next reply, in the format of the request it answers, or INCOMPLETE."""
        return self._replies.read(reply, count)

    @property
    def replies(self) -> ReplyBuffer:
        """The received bytes, which :meth:`read` and :meth:`receive` go to: the
        I/O layer's hot path uses it directly, a call less each way."""
        return self._replies

    # -- the handshake and authentication ----------------------------------------------
    def hello(self) -> bytes:
        """Start over on a new connection: the bytes to send first; then read a
        ``u32`` (the PING's reply format) and give it to :meth:`answered`."""
        self._replies.clear()
        self._auth = None
        self.extended = False
        if self.phase is not Phase.CLOSED:
            self.phase = advance(self.phase, Event.CLOSED)
        self.phase = advance(self.phase, Event.CONNECTED)
        return HELLO

    def answered(self, answer: int) -> bytes | None:
        """Take the answer to the handshake PING: the authentication challenge to
        send (then read bytes and give them to :meth:`prove`), or None when serving."""
        if answer == CONNECTION_REFUSED:
            raise StoreConnectionError(
                f"the store at {self._endpoint} refused the connection: it is at its "
                "connection limit (max_connections); retry later, or raise the server's "
                "max_connections",
                self._host,
                self._port,
            )
        if answer in (EXTENSION_ACCEPT, EXTENSION_ACCEPT_AUTH):
            self.extended = True
        elif answer != EXTENSION_OFFER:  # a PyTorch server echoes the nonce
            raise StoreConnectionError(
                f"the store at {self._endpoint} answered the handshake PING with {answer!r}",
                self._host,
                self._port,
            )
        if self._secret is None:
            if answer == EXTENSION_ACCEPT_AUTH:
                raise StoreAuthenticationError(
                    f"the store at {self._endpoint} requires a secret and this client has "
                    "none (set TP_STORE_SECRET or TP_STORE_SECRET_FILE, or pass secret_file)",
                    self._host,
                    self._port,
                )
            self.phase = advance(self.phase, Event.HELLO)
            return None
        if not self.extended:
            raise StoreAuthenticationError(
                f"the store at {self._endpoint} is not a tp-store server and cannot "
                "authenticate, but this client has a secret: refusing to continue",
                self._host,
                self._port,
            )
        self.phase = advance(self.phase, Event.HELLO_AUTH)
        self._auth = ClientAuthenticator(self._secret)
        return self._auth.challenge().encode()

    def prove(self, server_nonce: bytes) -> bytes:
        """Our proof (to send, then read bytes for :meth:`verify`), given the server's nonce."""
        return self._authenticator().prove(server_nonce).encode()

    def verify(self, server_proof: bytes) -> None:
        """Check the server's proof; the session is serving once it holds."""
        self._authenticator().verify(server_proof)
        self._auth = None
        self.phase = advance(self.phase, Event.AUTHENTICATED)

    def _authenticator(self) -> ClientAuthenticator:
        auth = self._auth
        if auth is None or self.phase is not Phase.AUTH:
            raise ProtocolError(f"no authentication under way in the {self.phase.value} phase")
        return auth

    # -- waits ----------------------------------------------------------------------------
    def parked(self) -> None:
        """A WAIT, WAIT_GET or BARRIER was sent: until its reply, only CANCEL_WAIT may be."""
        phase = self.phase
        self.phase = _WAITING if phase is _SERVING else advance(phase, Event.PARKED)

    def woken(self) -> None:
        """The parked request was answered."""
        phase = self.phase
        self.phase = _WOKEN if phase is _WAITING else advance(phase, Event.WOKEN)

    def keep_waiting(self) -> bytes:
        """The WAIT_KEEPALIVE to send while a request is parked: no reply comes, and the
        wait stays parked (a store session sees a frame; our servers only)."""
        if self.phase is not Phase.WAITING:
            raise ProtocolError(f"WAIT_KEEPALIVE in the {self.phase.value} phase")
        if not self.extended:
            raise ProtocolError("WAIT_KEEPALIVE to a server that has not accepted the extensions")
        return WAIT_KEEPALIVE

    def cancel(self) -> bytes:
        """The CANCEL_WAIT to send for the parked request (its reply, or the wait's
        STOP_WAITING then it, come next)."""
        if self.phase is not Phase.WAITING:
            raise ProtocolError(f"CANCEL_WAIT in the {self.phase.value} phase")
        self.phase = advance(self.phase, Event.CANCELLED)
        return CANCEL_WAIT

    def closed(self) -> None:
        """The connection is gone: what was buffered is dropped."""
        self._replies.clear()
        self._auth = None
        self.phase = advance(self.phase, Event.CLOSED)
