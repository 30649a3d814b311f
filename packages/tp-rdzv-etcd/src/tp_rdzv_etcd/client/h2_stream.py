"""One gRPC bidirectional stream on an HTTP/2 connection of its own, whose sends
go out together: the ``h2`` state machine (sans-IO) on a socket.

grpcio sends a stream's messages one at a time, each once the one before is
written, so a burst of 60 keep-alives reaches etcd as 60 wake-ups; etcd's
CPU per keep-alive is mostly waking up. :meth:`H2Stream.send` puts all the
messages it is given in one write. Measured on this project's 2-vCPU machine,
1,000 leases renewed every 5 s from 8 processes in bursts: etcd spent 44-45 ms
of CPU a second through grpcio, 13 ms with each burst in one write.

Only what the lease keep-alive stream needs: one stream a connection, no
compression, no credentials beyond TLS.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any
from urllib.parse import unquote

from tp_rdzv_etcd.endpoints import Endpoint

from .gateway import TlsFiles

try:
    import h2.config
    import h2.connection
    import h2.events
    import h2.exceptions

    _HAVE_H2 = True
except ImportError:  # pragma: no cover - h2 is a dependency; a broken install uses the gateway
    _HAVE_H2 = False

#: gRPC status UNAVAILABLE: the connection or the stream broke without a status.
UNAVAILABLE = 14
#: The largest answer taken on a stream; a longer one is a broken peer.
MAX_MESSAGE = 1 << 20
_CONNECT_TIMEOUT = 10.0
_SETTINGS = 0x4  # the HTTP/2 frame type
_MAX_SETTINGS = 6 * 64  # a SETTINGS frame of 64 settings: more than HTTP/2 defines
_READ_SIZE = 65536


def available() -> bool:
    """Whether streams can be made here (``h2`` is installed)."""
    return _HAVE_H2


class GrpcStreamEnded(Exception):
    """The stream ended; ``code`` is its gRPC status (:data:`UNAVAILABLE` if none came)."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def frame_messages(messages: Sequence[bytes]) -> bytes:
    """``messages`` in gRPC's length-prefixed framing (uncompressed)."""
    return b"".join(b"\0" + len(message).to_bytes(4, "big") + message for message in messages)


class MessageReader:
    """gRPC's length-prefixed messages out of a stream's data, however it is cut."""

    def __init__(self, limit: int = MAX_MESSAGE) -> None:
        self._buffer = bytearray()
        self._limit = limit

    def feed(self, data: bytes) -> list[bytes]:
        """The messages ``data`` completes.

        Raises ``ValueError`` on a compressed or an oversize message."""
        self._buffer += data
        messages = []
        while len(self._buffer) >= 5:
            if self._buffer[0] != 0:
                raise ValueError("a compressed gRPC message (none was asked for)")
            size = int.from_bytes(self._buffer[1:5], "big")
            if size > self._limit:
                raise ValueError(f"a gRPC message of {size} bytes (at most {self._limit})")
            if len(self._buffer) < 5 + size:
                break
            messages.append(bytes(self._buffer[5 : 5 + size]))
            del self._buffer[: 5 + size]
        return messages


class H2Stream:
    """One call of ``method`` on ``endpoint``: :meth:`send` any time (before the
    connection is up, messages wait for it), :meth:`answers` on one reader thread,
    :meth:`close` from anywhere."""

    def __init__(
        self,
        endpoint: Endpoint,
        tls: TlsFiles,
        method: str,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        assert _HAVE_H2
        self.endpoint = endpoint
        self._tls = tls
        self._method = method
        self._metadata = tuple(metadata)
        self._lock = threading.Lock()  # the state machine, the socket's writes, the queue
        self._conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self._sock: socket.socket | None = None
        self._stream_id = 0
        self._unsent = bytearray()  # framed messages not yet sent (no connection, no window)
        self._closed = False

    def send(self, messages: Sequence[bytes]) -> None:
        """Send ``messages``, all in one write when the flow-control window allows."""
        with self._lock:
            if self._closed:
                return
            self._unsent += frame_messages(messages)
            if self._sock is not None:
                self._flush_unsent()

    def answers(self) -> Iterator[bytes]:
        """Connect, then the call's answers as they come, until it ends.

        Raises:
            GrpcStreamEnded: the call ended (with etcd's status, or
                :data:`UNAVAILABLE` when the connection broke or closed).
            ValueError: a malformed answer (the connection is then closed).
        """
        try:
            yield from self._run()
        finally:
            self.close()

    def close(self) -> None:
        """End the call; a reader blocked in :meth:`answers` returns."""
        with self._lock:
            self._closed = True
            sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):  # never connected, or already gone
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _run(self) -> Iterator[bytes]:
        try:
            sock = self._connect()
        except OSError as exc:
            raise GrpcStreamEnded(UNAVAILABLE, f"cannot connect: {exc}") from exc
        reader = MessageReader()
        status: tuple[int, str] | None = None
        preface: bytes | None = b""  # the server's first frame header, until checked
        while True:
            try:
                data = sock.recv(_READ_SIZE)
            except OSError as exc:
                raise GrpcStreamEnded(UNAVAILABLE, f"connection lost: {exc}") from exc
            if not data:
                raise GrpcStreamEnded(UNAVAILABLE, "the connection closed")
            if preface is not None:
                preface += data
                if len(preface) >= 9:
                    _check_server_preface(preface[:9])
                    preface = None
            with self._lock:
                try:
                    events = self._conn.receive_data(data)
                except h2.exceptions.ProtocolError as exc:
                    raise ValueError(f"HTTP/2 protocol error: {exc}") from exc
                answers: list[bytes] = []
                for event in events:
                    if isinstance(event, h2.events.DataReceived):
                        answers += reader.feed(event.data)
                        self._conn.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    elif isinstance(event, h2.events.ResponseReceived):
                        status = _status(event.headers) or _http_status(event.headers)
                    elif isinstance(event, h2.events.TrailersReceived):
                        status = _status(event.headers) or status
                    elif isinstance(event, h2.events.WindowUpdated):
                        self._flush_unsent()
                    elif isinstance(event, h2.events.StreamEnded):
                        # A stream the client never ends has no good end: status 0 too is a break.
                        code, details = status or (UNAVAILABLE, "the call ended without a status")
                        raise GrpcStreamEnded(code or UNAVAILABLE, details)
                    elif isinstance(event, h2.events.StreamReset):
                        reset = f"reset (HTTP/2 error {event.error_code})"
                        raise GrpcStreamEnded(UNAVAILABLE, reset)
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        raise GrpcStreamEnded(UNAVAILABLE, "the server closed the connection")
                self._write(self._conn.data_to_send())
            yield from answers

    def _connect(self) -> socket.socket:
        endpoint = self.endpoint
        sock = socket.create_connection((endpoint.host, endpoint.port), _CONNECT_TIMEOUT)
        try:
            if endpoint.scheme == "https":
                sock = self._tls_context().wrap_socket(sock, server_hostname=endpoint.host)
            sock.settimeout(None)  # close() ends a blocked read
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._closed:
                    raise OSError("closed while connecting")
                self._sock = sock
                self._conn.initiate_connection()
                self._stream_id = self._conn.get_next_available_stream_id()
                self._conn.send_headers(self._stream_id, self._headers())
                self._flush_unsent()
        except BaseException:
            sock.close()
            raise
        return sock

    def _headers(self) -> list[tuple[str, str]]:
        host = f"[{self.endpoint.host}]" if ":" in self.endpoint.host else self.endpoint.host
        return [
            (":method", "POST"),
            (":scheme", self.endpoint.scheme),
            (":path", self._method),
            (":authority", f"{host}:{self.endpoint.port}"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *self._metadata,
        ]

    def _tls_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self._tls.cacert)
        if self._tls.cert is not None:
            context.load_cert_chain(self._tls.cert, self._tls.key)
        context.set_alpn_protocols(["h2"])
        return context

    def _flush_unsent(self) -> None:
        """Send what the windows allow of the queued messages (the lock is held)."""
        try:
            while self._unsent:
                allowed = min(
                    len(self._unsent),
                    self._conn.local_flow_control_window(self._stream_id),
                    self._conn.max_outbound_frame_size,
                )
                if allowed <= 0:
                    break  # the rest when the peer opens the window
                self._conn.send_data(self._stream_id, bytes(self._unsent[:allowed]))
                del self._unsent[:allowed]
        except h2.exceptions.H2Error:
            # The server ended the stream (its reset or end is in the reader's next
            # events): these messages cannot go; their waiters fail with the stream.
            self._unsent.clear()
        self._write(self._conn.data_to_send())

    def _write(self, data: bytes) -> None:
        if data and self._sock is not None:
            with contextlib.suppress(OSError):  # the reader finds the connection gone
                self._sock.sendall(data)


def _check_server_preface(header: bytes) -> None:
    """An HTTP/2 server speaks first with a SETTINGS frame (RFC 9113, 3.4); anything
    else (an HTTP/1.1 answer, garbage) is refused at once, not buffered as a frame."""
    if header[3] != _SETTINGS or int.from_bytes(header[:3], "big") > _MAX_SETTINGS:
        raise ValueError(f"not an HTTP/2 server: it began with {header!r}")


def _fields(headers: Iterable[tuple[Any, Any]]) -> dict[str, str]:
    """Headers as text (the connection decodes them as UTF-8)."""
    return {str(name): str(value) for name, value in headers}


def _status(headers: Iterable[tuple[Any, Any]]) -> tuple[int, str] | None:
    """The gRPC status in response headers or trailers, if any."""
    fields = _fields(headers)
    code = fields.get("grpc-status")
    if code is None:
        return None
    try:
        number = int(code)
    except ValueError:
        number = UNAVAILABLE
    return number, unquote(fields.get("grpc-message", "")) or f"gRPC status {code}"


def _http_status(headers: Iterable[tuple[Any, Any]]) -> tuple[int, str] | None:
    """A response that is not gRPC's (HTTP status other than 200: a proxy's), as a break."""
    status = _fields(headers).get(":status")
    return None if status == "200" else (UNAVAILABLE, f"HTTP status {status} (not a gRPC server)")
