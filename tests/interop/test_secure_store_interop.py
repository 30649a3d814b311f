"""PyTorch's TCPStore client against our server with and without a shared secret.

A server with a secret answers the handshake a PyTorch client makes (VALIDATE,
then PING with its pid) and closes the connection on its first real request:
PyTorch has no authentication, so it is refused, with nothing read or written.
The same server without a secret serves it as always.

PyTorch has no TLS either: a PyTorch client cannot reach our TLS server at
all (its first bytes are not a TLS ClientHello), which
``packages/tp-store/tests/test_security.py`` shows with a client that sends
exactly what PyTorch's does.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from interop_support import (
    OurServer,
    RemoteError,
    WorkerPool,
    child_env,
    start_our_server,
)

from tp_store import TCPStore
from tp_store.security import SECRET_ENV, SECRET_FILE_ENV

pytestmark = pytest.mark.interop

SECRET = "an interop secret, long enough"
STORE_TIMEOUT = 5.0


@pytest.fixture
def secret_server() -> Iterator[OurServer]:
    """Our standalone server with ``TP_STORE_SECRET`` set in its environment."""
    env = child_env()
    env.pop(SECRET_FILE_ENV, None)
    env[SECRET_ENV] = SECRET
    server = start_our_server(env=env)
    try:
        yield server
        server.assert_alive()
    finally:
        server.stop()


def ours(server: OurServer, secret: str | None) -> TCPStore:
    return TCPStore(
        server.host,
        server.port,
        timeout=STORE_TIMEOUT,
        secret=None if secret is None else secret.encode(),
    )


def test_a_torch_client_is_refused_by_a_server_with_a_secret(
    secret_server: OurServer, workers: WorkerPool
) -> None:
    (worker,) = workers.get(1)
    # The constructor only does the handshake, which the server answers.
    torch_store = worker.store(host_name=secret_server.host, port=secret_server.port)
    # Its first real request closes the connection. PyTorch's set does not
    # wait for a reply, so the failure shows on the next request.
    torch_store.set("stolen", "value")
    with pytest.raises(RemoteError) as refused:
        torch_store.get("stolen")
    assert refused.value.is_a("DistNetworkError"), refused.value
    with pytest.raises(RemoteError):
        torch_store.add("counter", 1)
    admin = ours(secret_server, SECRET)
    try:
        assert admin.num_keys() == 0  # nothing was written
        assert admin.server_stats()["connections_auth_failures"] >= 1
    finally:
        admin.close()


def test_a_torch_client_with_a_world_size_fails_in_its_constructor(
    secret_server: OurServer, workers: WorkerPool
) -> None:
    (worker,) = workers.get(1)
    # With a world size the constructor counts itself in (ADD init/ 1): refused.
    with pytest.raises(RemoteError):
        worker.store(
            host_name=secret_server.host,
            port=secret_server.port,
            world_size=2,
            wait_for_workers=True,
        )


def test_a_torch_client_is_served_by_an_open_server(
    our_server: OurServer, workers: WorkerPool
) -> None:
    (worker,) = workers.get(1)
    torch_store = worker.store(host_name=our_server.host, port=our_server.port)
    torch_store.set("k", "v")
    assert torch_store.get("k") == b"v"
    assert torch_store.add("n", 2) == 2
    mine = ours(our_server, None)
    try:
        assert mine.get("k") == b"v"
        assert mine.server_stats()["connections_auth_failures"] == 0
    finally:
        mine.close()


def test_our_client_with_the_secret_works_beside_refused_torch_clients(
    secret_server: OurServer, workers: WorkerPool
) -> None:
    (worker,) = workers.get(1)
    torch_store = worker.store(host_name=secret_server.host, port=secret_server.port)
    with pytest.raises(RemoteError):
        torch_store.add("k", 1)
    mine = ours(secret_server, SECRET)
    try:
        mine.set("k", "mine")
        assert mine.get("k") == b"mine"
    finally:
        mine.close()
