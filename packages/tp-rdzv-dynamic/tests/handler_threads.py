"""Nodes as threads of the test process: handlers on a real TCPStore server on loopback.

The fixtures ``server`` and ``make_node`` (in ``conftest.py``) build on
:func:`make_handler`; the tests use :func:`rendezvous_all` and :func:`wait_until`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from tp_rdzv_api import RendezvousInfo, RendezvousTimeout
from tp_rdzv_dynamic import DynamicRendezvousHandler, TpRendezvousBackend
from tp_store import TCPStore

#: The run every handler of these tests joins.
RUN = "job"


def make_handler(  # noqa: PLR0917 - a test helper, read at each call site
    port: int,
    min_nodes: int,
    max_nodes: int,
    join: float = 30,
    last_call: float = 0.3,
    interval: float = 0.5,
    backend: type = TpRendezvousBackend,
    local_addr: str = "127.0.0.1",
    attempts: int = 2,
) -> DynamicRendezvousHandler:
    """A handler of :data:`RUN` on its own connection to the server at ``port``.

    A silent node is dead after ``attempts`` (two) ``interval`` s.
    """
    store = TCPStore("127.0.0.1", port, timeout=10)
    return DynamicRendezvousHandler.from_backend(
        RUN,
        store,
        backend(store, RUN),
        min_nodes,
        max_nodes,
        local_addr=local_addr,
        timeout=RendezvousTimeout(join=join, last_call=last_call),
        keep_alive_interval=interval,
        keep_alive_max_attempt=attempts,
    )


def rendezvous_all(handlers: list[DynamicRendezvousHandler]) -> list[RendezvousInfo]:
    """``next_rendezvous()`` of every handler at once, each in a thread."""
    with ThreadPoolExecutor(len(handlers)) as pool:
        return list(pool.map(lambda h: h.next_rendezvous(), handlers))


def wait_until(condition: Callable[[], bool], seconds: float = 10) -> None:
    """Return once ``condition()`` holds; fail the test after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def stop_handler(handler: DynamicRendezvousHandler) -> None:
    """Stop ``handler``'s threads (its steward, heartbeats and presence) and its
    bootstrap store's process, without closing."""
    handler._office.stop()
    handler._heartbeats.stop()
    handler._presence.close()
    handler._bootstrap.shutdown()


def close_presence_connection(server: TCPStore, handler: DynamicRendezvousHandler) -> None:
    """Make ``server`` close the connection that holds ``handler``'s presence session,
    as it does when the session expires (its process was frozen past the bound)."""
    thread = server._server
    assert thread is not None
    assert handler._presence._session is not None
    session_id = handler._presence._session.id

    def close() -> int:
        held = [
            connection
            for connection in list(thread.server.connections)
            if connection._session.store_session is not None
            and connection._session.store_session.id == session_id
        ]
        for connection in held:
            connection.close("the test ends its presence session", action="test")
        return len(held)

    assert thread.call(close) == 1


@contextmanager
def running_server() -> Iterator[TCPStore]:
    """A real TCPStore server on loopback, closed on leaving."""
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=10)
    try:
        yield master
    finally:
        master.close()


@contextmanager
def recorded_thread_deaths(deaths: list[threading.ExceptHookArgs]) -> Iterator[None]:
    """Collect into ``deaths`` every thread that ends with an exception meanwhile."""
    previous = threading.excepthook
    threading.excepthook = deaths.append
    try:
        yield
    finally:
        threading.excepthook = previous
