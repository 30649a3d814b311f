"""For the server tests: a raw-socket client, a polling wait, and a server thread per event loop.

A plain module, not a plugin: ``conftest.py`` puts this directory on ``sys.path``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import tp_store.server.store_server as server_module
from tp_store.protocol import Incomplete, Ping, ReplyKind, ReplyParser, Validate
from tp_store.server.store_server import ServerThread, StoreServer

#: The event loops a server test runs on (uvloop when installed).
EVENT_LOOPS = ("asyncio", "uvloop")

#: How long any single step may take before the test fails (generous for loaded CI).
TIMEOUT = 10.0


@contextmanager
def server_thread(
    event_loop: str, monkeypatch: pytest.MonkeyPatch, **options: Any
) -> Iterator[ServerThread]:
    """A fresh server on 127.0.0.1 in a thread, on ``event_loop`` (skipped without uvloop),
    made with the :class:`StoreServer` keyword ``options``."""
    if event_loop == "uvloop":
        if importlib.util.find_spec("uvloop") is None:
            pytest.skip("uvloop is not installed")
    else:
        monkeypatch.setattr(server_module, "new_event_loop", asyncio.new_event_loop)
    thread = ServerThread(StoreServer("127.0.0.1", 0, **options))
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds; fail the test after ``TIMEOUT`` seconds."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {TIMEOUT} s waiting until {what}")
        time.sleep(0.002)


class Raw:
    """A raw client socket (TCP_NODELAY) speaking the wire protocol byte by byte.

    VALIDATE is sent on connecting unless ``validate`` is false. Every byte sent
    and received is counted in :attr:`sent` and :attr:`received`, so the server's
    byte counters can be checked exactly. Replies are read either by size
    (:meth:`read_exact`, :meth:`read_blob`) or parsed by kind (:meth:`read_reply`,
    :meth:`request`); the parser may hold bytes past a reply, so a connection
    sticks to one of the two.
    """

    def __init__(self, port: int, host: str = "127.0.0.1", validate: bool = True) -> None:
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = ReplyParser()
        self.sent = 0
        self.received = 0
        if validate:
            self.send(Validate().encode())

    def send(self, data: bytes) -> None:
        """Send all of ``data``."""
        self.sock.sendall(data)
        self.sent += len(data)

    def _recv(self, size: int) -> bytes:
        data = self.sock.recv(size)
        self.received += len(data)
        return data

    def read_exact(self, size: int) -> bytes:
        """Exactly ``size`` bytes; ConnectionError if the server closes first."""
        data = b""
        while len(data) < size:
            chunk = self._recv(size - len(data))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            data += chunk
        return data

    def read_blob(self) -> bytes:
        """A byte-string reply: its u64 length, then its bytes."""
        return self.read_exact(int.from_bytes(self.read_exact(8), "little"))

    def read_reply(self, kind: ReplyKind, count: int = 0) -> Any:
        """The next reply, parsed as ``kind`` (``count`` for the kinds that take one)."""
        self.parser.expect(kind, count)
        while isinstance(reply := self.parser.next_reply(), Incomplete):
            data = self._recv(65536)
            if not data:
                raise ConnectionError("the server closed the connection")
            self.parser.feed(data)
        return reply

    def request(self, data: bytes, kind: ReplyKind, count: int = 0) -> Any:
        """Send ``data`` and return its reply, parsed as ``kind``."""
        self.send(data)
        return self.read_reply(kind, count)

    def ping(self, nonce: int = 12345) -> None:
        """A round trip: the server answers, and nothing stray came before the answer."""
        assert self.request(Ping(nonce).encode(), ReplyKind.U32) == nonce

    def assert_closed(self) -> bytes:
        """Read until the server closes; return what came first. Fails on a read timeout."""
        received = b""
        self.sock.settimeout(TIMEOUT)
        while True:
            try:
                data = self._recv(65536)
            except ConnectionResetError:
                return received
            except TimeoutError:
                pytest.fail(f"the server kept the connection open for {TIMEOUT} s")
            if not data:
                return received
            received += data

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()
