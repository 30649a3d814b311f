"""The in-process servers of ``TCPStore`` masters: one per master, or shared by port."""

from __future__ import annotations

import collections
import threading

from .security import TLSConfig
from .server import ServerThread, StoreServer

#: A server's TLS files and secret: masters sharing a port must agree on them.
Security = tuple[TLSConfig, "bytes | None"]


class SharedServers:
    """In-process servers of ``multi_tenant`` masters, keyed by port, refcounted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._servers: dict[int, tuple[ServerThread, int, Security]] = {}
        # Released by garbage collection, not yet counted down (see abandon).
        self._abandoned: collections.deque[ServerThread] = collections.deque()

    def acquire(
        self, host: str, port: int, listen_fd: int | None, security: Security
    ) -> ServerThread:
        try:
            with self._lock:
                if port and port in self._servers:
                    thread, users, shared = self._servers[port]
                    if shared != security:
                        raise ValueError(
                            f"a multi_tenant master on port {port} already runs with other "
                            "TLS files or another secret"
                        )
                    self._servers[port] = (thread, users + 1, shared)
                    return thread
                thread = start_server(host, port, listen_fd, security)
                self._servers[thread.server.port] = (thread, 1, security)
                return thread
        finally:
            self._count_abandoned()

    def release(self, thread: ServerThread) -> None:
        """One user fewer (``close``); the last one stops the server."""
        with self._lock:
            last = self._count_down(thread)
        if last:
            thread.stop()
        self._count_abandoned()

    def abandon(self, thread: ServerThread) -> None:
        """:meth:`release` for a master collected without ``close``, never blocking.

        Garbage collection runs finalizers in whatever thread allocates, also
        while this thread holds the lock in :meth:`acquire`, or in the server
        thread that :meth:`acquire` waits for: waiting for the lock there would
        deadlock. The holder of the lock counts it down as it lets go instead.
        """
        self._abandoned.append(thread)
        self._count_abandoned()

    def _count_abandoned(self) -> None:
        while self._abandoned and self._lock.acquire(blocking=False):
            last: list[ServerThread] = []
            try:
                while self._abandoned:
                    thread = self._abandoned.popleft()
                    if self._count_down(thread):
                        last.append(thread)
            finally:
                self._lock.release()
            for thread in last:
                thread.stop()

    def _count_down(self, thread: ServerThread) -> bool:
        """Whether ``thread``'s server lost its last user (lock held)."""
        port = thread.server.port
        _, users, security = self._servers[port]
        if users > 1:
            self._servers[port] = (thread, users - 1, security)
            return False
        del self._servers[port]
        return True


#: The process's shared servers.
shared_servers = SharedServers()


def start_server(host: str, port: int, listen_fd: int | None, security: Security) -> ServerThread:
    """A master's server, started (TLS when ``security`` holds a certificate)."""
    tls, secret = security
    context = tls.server_context() if tls.cert is not None else None
    thread = ServerThread(StoreServer(host, port, listen_fd=listen_fd, ssl=context, secret=secret))
    thread.start()
    return thread
