"""TLS and shared-secret authentication: the sans-IO exchange, secret loading, and
real servers and clients over loopback sockets.

A "PyTorch-like" client here is a raw socket that does what PyTorch's client
does (VALIDATE, PING with its pid, then plain requests); the real PyTorch
client is in tests/interop/test_secure_store_interop.py.
"""

from __future__ import annotations

import logging
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from raw_client import Raw, wait_until

from tp_store import (
    StoreAuthenticationError,
    StoreConnectionError,
    StoreTimeoutError,
    TCPStore,
    TLSConfig,
)
from tp_store.errors import ProtocolError
from tp_store.protocol import (
    AUTH_NONCE_BYTES,
    EXTENSION_ACCEPT,
    EXTENSION_ACCEPT_AUTH,
    EXTENSION_OFFER,
    AuthChallenge,
    AuthProof,
    ClientAuthenticator,
    Get,
    ReplyKind,
    ServerAuthenticator,
    Set,
    Stats,
    Validate,
    auth_proof,
)
from tp_store.protocol import Ping as PingRequest
from tp_store.security import (
    SECRET_ENV,
    SECRET_FILE_ENV,
    client_ssl_context,
    load_secret,
    server_ssl_context,
)
from tp_store.server.store_server import ServerThread, StoreServer
from tp_store.testing.tls import TestPKI

TIMEOUT = 10.0
SECRET = b"correct horse battery staple"


@pytest.fixture(autouse=True)
def no_secret_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests set the secret variables themselves; the developer's shell must not leak in."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(SECRET_FILE_ENV, raising=False)


def serve(**kwargs: object) -> ServerThread:
    thread = ServerThread(StoreServer("127.0.0.1", 0, **kwargs))  # type: ignore[arg-type]
    thread.start()
    return thread


@pytest.fixture
def secret_server() -> Iterator[ServerThread]:
    thread = serve(secret=SECRET)
    yield thread
    thread.stop()


@pytest.fixture
def open_server() -> Iterator[ServerThread]:
    thread = serve()
    yield thread
    thread.stop()


# ---------------------------------------------------------------------------
# The exchange, without I/O
# ---------------------------------------------------------------------------


def exchange(client_secret: bytes, server_secret: bytes | None) -> None:
    client = ClientAuthenticator(client_secret)
    server = ServerAuthenticator(server_secret)
    nonce = server.challenge(client.challenge().nonce)
    proof = client.prove(nonce)
    answer = server.check(proof.proof)
    client.verify(b"" if answer is None else answer)


def test_the_same_secret_authenticates_both_ways() -> None:
    exchange(SECRET, SECRET)


def test_a_wrong_secret_is_refused_by_the_server() -> None:
    client = ClientAuthenticator(b"the wrong secret, long enough")
    server = ServerAuthenticator(SECRET)
    proof = client.prove(server.challenge(client.challenge().nonce))
    assert server.check(proof.proof) is None
    with pytest.raises(StoreAuthenticationError, match="the secrets differ"):
        client.verify(b"")


def test_a_server_without_the_secret_cannot_pass_for_one() -> None:
    client = ClientAuthenticator(SECRET)
    impostor = ServerAuthenticator(b"a guess at the secret")
    proof = client.prove(impostor.challenge(client.challenge().nonce))
    # The impostor accepts anything and answers with its own proof.
    forged = auth_proof(b"a guess at the secret", b"server", os.urandom(32), os.urandom(32))
    assert proof.proof != forged
    with pytest.raises(StoreAuthenticationError, match="could not prove"):
        client.verify(forged)


def test_a_client_with_a_secret_refuses_a_server_without_one() -> None:
    client = ClientAuthenticator(SECRET)
    server = ServerAuthenticator(None)
    nonce = server.challenge(client.challenge().nonce)
    assert nonce == b""
    with pytest.raises(StoreAuthenticationError, match="no secret configured"):
        client.prove(nonce)


def test_the_server_proof_is_not_the_client_proof() -> None:
    # Reflecting the client's proof back must not authenticate the server.
    client = ClientAuthenticator(SECRET)
    server = ServerAuthenticator(SECRET)
    proof = client.prove(server.challenge(client.challenge().nonce))
    with pytest.raises(StoreAuthenticationError):
        client.verify(proof.proof)


def test_the_secret_never_goes_on_the_wire() -> None:
    client = ClientAuthenticator(SECRET)
    server = ServerAuthenticator(SECRET)
    sent = client.challenge().encode()
    nonce = server.challenge(AuthChallenge(sent[9:]).nonce)
    sent += client.prove(nonce).encode()
    assert SECRET not in sent
    assert len(sent) == 2 * (1 + 8 + 32)


def test_out_of_order_exchanges_are_protocol_errors() -> None:
    server = ServerAuthenticator(SECRET)
    with pytest.raises(ProtocolError, match="without a challenge"):
        server.check(b"x" * 32)
    with pytest.raises(ProtocolError, match="expected 32"):
        server.challenge(b"short")
    server.challenge(b"n" * AUTH_NONCE_BYTES)
    with pytest.raises(ProtocolError, match="twice"):
        server.challenge(b"n" * AUTH_NONCE_BYTES)
    assert server.check(b"x" * 32) is None
    with pytest.raises(ProtocolError, match="without a challenge"):
        server.check(b"x" * 32)  # one attempt per connection
    with pytest.raises(ProtocolError, match="without a challenge"):
        ServerAuthenticator(None).check(b"x" * 32)


def test_empty_or_non_bytes_secrets_are_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        ClientAuthenticator(b"")
    with pytest.raises(TypeError, match="must be bytes"):
        ServerAuthenticator("text")  # type: ignore[arg-type]


def test_auth_requests_round_trip() -> None:
    assert AuthChallenge(b"n" * 32).encode()[0] == 0xE2
    assert AuthProof(b"p" * 32).encode()[0] == 0xE3


# ---------------------------------------------------------------------------
# Where secrets come from
# ---------------------------------------------------------------------------


def test_secret_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_secret() is None
    monkeypatch.setenv(SECRET_ENV, "a secret from the environment")
    assert load_secret() == b"a secret from the environment"


def test_secret_from_a_file_named_in_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"a secret from a file\n")
    monkeypatch.setenv(SECRET_FILE_ENV, str(path))
    assert load_secret() == b"a secret from a file"


def test_explicit_sources_win_over_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(SECRET_ENV, "a secret from the environment")
    path = tmp_path / "secret"
    path.write_bytes(b"a secret from a file")
    assert load_secret(secret_file=path) == b"a secret from a file"
    given = b"the secret given as an argument"
    assert load_secret(secret=given) == given


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ({SECRET_ENV: ""}, "TP_STORE_SECRET is set but empty"),
        ({SECRET_ENV: "a", SECRET_FILE_ENV: "b"}, "not both"),
        ({SECRET_FILE_ENV: "/nonexistent/secret"}, "cannot read the store secret file"),
        ({SECRET_FILE_ENV: "EMPTY"}, "is empty"),
    ],
)
def test_bad_secret_sources_are_clear_errors(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, setup: dict[str, str], message: str
) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"\n")
    for name, value in setup.items():
        monkeypatch.setenv(name, str(empty) if value == "EMPTY" else value)
    with pytest.raises(ValueError, match=message):
        load_secret()


def test_secret_and_secret_file_together_are_ambiguous(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not both"):
        load_secret(secret=b"a", secret_file=tmp_path / "x")


# ---------------------------------------------------------------------------
# Authentication over real sockets
# ---------------------------------------------------------------------------


def test_our_client_with_the_secret_is_served(secret_server: ServerThread) -> None:
    store = TCPStore("127.0.0.1", secret_server.server.port, timeout=TIMEOUT, secret=SECRET)
    store.set("k", "v")
    assert store.get("k") == b"v"
    stats = store.server_stats()
    assert stats["ops"]["auth_proof"] == 1
    assert stats["connections_auth_failures"] == 0
    store.close()


def test_a_wrong_secret_is_refused(
    secret_server: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(StoreAuthenticationError, match="the secrets differ"):
        TCPStore(
            "127.0.0.1", secret_server.server.port, timeout=TIMEOUT, secret=b"a wrong secret, long"
        )
    # The server answers the wrong proof before it counts and logs the failure.
    wait_until(
        lambda: any("authentication failed" in r.getMessage() for r in caplog.records),
        "the failure is logged",
    )
    assert secret_server.server.stats()["connections_auth_failures"] == 1


def test_our_client_without_a_secret_is_told_one_is_needed(secret_server: ServerThread) -> None:
    with pytest.raises(StoreAuthenticationError, match="requires a secret"):
        TCPStore("127.0.0.1", secret_server.server.port, timeout=TIMEOUT)


def test_a_client_with_a_secret_refuses_an_open_server(open_server: ServerThread) -> None:
    with pytest.raises(StoreAuthenticationError, match="no secret configured"):
        TCPStore("127.0.0.1", open_server.server.port, timeout=TIMEOUT, secret=SECRET)


def test_an_open_server_still_serves_pytorch_like_clients(open_server: ServerThread) -> None:
    raw = Raw(open_server.server.port)
    assert raw.request(PingRequest(os.getpid()).encode(), ReplyKind.U32) == os.getpid()
    raw.send(Set(b"/k", b"v").encode())
    assert raw.request(Get(b"/k").encode(), ReplyKind.BYTES) == b"v"
    raw.close()


@pytest.mark.parametrize(
    "request_bytes",
    [Set(b"/k", b"v").encode(), Get(b"/k").encode(), Stats().encode()],
    ids=["set", "get", "stats"],
)
def test_a_pytorch_like_client_is_refused_on_its_first_request(
    secret_server: ServerThread, request_bytes: bytes
) -> None:
    raw = Raw(secret_server.server.port)
    # The handshake PING is answered (a PyTorch client needs it to connect) ...
    assert raw.request(PingRequest(os.getpid()).encode(), ReplyKind.U32) == os.getpid()
    # ... and its first real request closes the connection, with nothing done.
    raw.send(request_bytes)
    raw.assert_closed()
    assert secret_server.server.state.num_keys() == 0
    assert secret_server.server.stats()["connections_auth_failures"] == 1


def test_the_extension_ping_says_a_secret_is_required(
    secret_server: ServerThread, open_server: ServerThread
) -> None:
    for thread, expected in (
        (secret_server, EXTENSION_ACCEPT_AUTH),
        (open_server, EXTENSION_ACCEPT),
    ):
        raw = Raw(thread.server.port)
        assert raw.request(PingRequest(EXTENSION_OFFER).encode(), ReplyKind.U32) == expected
        raw.close()


def test_auth_before_the_extension_offer_is_a_protocol_error(
    secret_server: ServerThread,
) -> None:
    raw = Raw(secret_server.server.port, validate=False)
    raw.send(Validate().encode() + AuthChallenge(b"n" * 32).encode())
    raw.assert_closed()


def test_an_unauthenticated_connection_is_closed_after_the_request_timeout() -> None:
    thread = serve(secret=SECRET, request_timeout=0.5)
    try:
        raw = Raw(thread.server.port)
        started = time.monotonic()
        raw.assert_closed()
        assert 0.4 < time.monotonic() - started < 5
        assert thread.server.stats()["connections_timed_out"] == 1
    finally:
        thread.stop()


def test_secret_from_the_environment_on_both_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "a shared secret, long")
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    try:
        assert master.server is not None
        assert master.server.secret == b"a shared secret, long"
        client = TCPStore("127.0.0.1", master.port, timeout=TIMEOUT)
        client.set("k", "v")
        assert master.get("k") == b"v"
        assert client.clone().get("k") == b"v"
        monkeypatch.delenv(SECRET_ENV)
        with pytest.raises(StoreAuthenticationError, match="requires a secret"):
            TCPStore("127.0.0.1", master.port, timeout=TIMEOUT)
    finally:
        master.close()


@pytest.mark.parametrize("secret", [b"x", b"s3cret", b"fifteen bytes!!"])
def test_a_short_secret_is_refused_wherever_it_comes_from(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, secret: bytes
) -> None:
    short = f"a store secret must be at least 16 bytes, got {len(secret)}"
    with pytest.raises(ValueError, match=short):
        StoreServer("127.0.0.1", 0, secret=secret)
    with pytest.raises(ValueError, match=short):
        TCPStore("127.0.0.1", 1, timeout=TIMEOUT, secret=secret)
    path = tmp_path / "secret"
    path.write_bytes(secret + b"\n")
    with pytest.raises(ValueError, match=short):
        load_secret(secret_file=path)
    monkeypatch.setenv(SECRET_FILE_ENV, str(path))
    with pytest.raises(ValueError, match=short):
        load_secret()
    monkeypatch.delenv(SECRET_FILE_ENV)
    monkeypatch.setenv(SECRET_ENV, secret.decode())
    with pytest.raises(ValueError, match=short):
        load_secret()
    # The server command says so in one line, with no traceback.
    result = subprocess.run(
        [sys.executable, "-m", "tp_store", "--port", "0", "--secret-file", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert result.returncode != 0
    assert short in result.stderr
    assert "Traceback" not in result.stderr
    # Sixteen bytes will do.
    monkeypatch.setenv(SECRET_ENV, "x" * 16)
    assert load_secret() == b"x" * 16


def test_secret_file_argument(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("a secret in a file\n")
    master = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT, secret_file=path
    )
    try:
        assert master.server is not None
        assert master.server.secret == b"a secret in a file"
        client = TCPStore("127.0.0.1", master.port, timeout=TIMEOUT, secret=b"a secret in a file")
        assert client.add("n", 2) == 2
    finally:
        master.close()


# ---------------------------------------------------------------------------
# TLS over real sockets
# ---------------------------------------------------------------------------


@pytest.fixture
def tls_server(pki: TestPKI) -> Iterator[ServerThread]:
    thread = serve(ssl=server_ssl_context(pki.server_cert, pki.server_key))
    yield thread
    thread.stop()


@pytest.fixture
def mtls_server(pki: TestPKI) -> Iterator[ServerThread]:
    thread = serve(ssl=server_ssl_context(pki.server_cert, pki.server_key, pki.ca), secret=SECRET)
    yield thread
    thread.stop()


def mtls_client(port: int, pki: TestPKI, secret: bytes = SECRET) -> TCPStore:
    """Our client to 127.0.0.1, trusting the test CA, with its client certificate and ``secret``."""
    return TCPStore(
        "127.0.0.1",
        port,
        timeout=TIMEOUT,
        tls_ca=pki.ca,
        tls_cert=pki.client_cert,
        tls_key=pki.client_key,
        secret=secret,
    )


def test_tls_client_and_server(tls_server: ServerThread, pki: TestPKI) -> None:
    store = TCPStore("127.0.0.1", tls_server.server.port, timeout=TIMEOUT, tls_ca=pki.ca)
    assert store.uses_tls
    assert store.uses_extensions
    store.set("k", "v")
    assert store.get("k") == b"v"
    assert store.multi_get(["k", "k"]) == [b"v", b"v"]
    # A timed-out wait leaves the TLS connection usable.
    started = time.monotonic()
    with pytest.raises(StoreTimeoutError):
        store.wait(["missing"], 0.2)
    assert time.monotonic() - started < 5
    assert store.add("n", 3) == 3
    store.close()


def test_tls_by_host_name(tls_server: ServerThread, pki: TestPKI) -> None:
    store = TCPStore("localhost", tls_server.server.port, timeout=TIMEOUT, tls_ca=pki.ca)
    store.set("k", "v")
    assert store.get("k") == b"v"
    store.close()


def test_a_plain_client_to_a_tls_server_fails_fast_and_clearly(
    tls_server: ServerThread,
) -> None:
    started = time.monotonic()
    # The client cannot tell a TLS server from one that closed at its
    # connection limit without saying so: it names both.
    with pytest.raises(
        StoreConnectionError,
        match=r"closed the connection during the handshake .*; is it at its connection limit "
        r"\(max_connections\), or does it require TLS \(tls_ca\)\?",
    ):
        TCPStore("127.0.0.1", tls_server.server.port, timeout=TIMEOUT)
    assert time.monotonic() - started < TIMEOUT / 2


def test_a_tls_client_refused_at_the_connection_limit_is_told_so(pki: TestPKI) -> None:
    thread = serve(ssl=server_ssl_context(pki.server_cert, pki.server_key), max_connections=1)
    try:
        holder = TCPStore("127.0.0.1", thread.server.port, timeout=TIMEOUT, tls_ca=pki.ca)
        with pytest.raises(
            StoreConnectionError, match=r"refused the connection: .*max_connections"
        ):
            TCPStore("127.0.0.1", thread.server.port, timeout=TIMEOUT, tls_ca=pki.ca)
        holder.close()
    finally:
        thread.stop()


def test_a_tls_client_to_a_plain_server_fails_clearly(
    open_server: ServerThread, pki: TestPKI
) -> None:
    with pytest.raises(StoreConnectionError, match="TLS handshake with the store"):
        TCPStore("127.0.0.1", open_server.server.port, timeout=TIMEOUT, tls_ca=pki.ca)


def test_a_server_certificate_from_another_ca_is_refused(
    tls_server: ServerThread, pki: TestPKI
) -> None:
    with pytest.raises(StoreConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        TCPStore("127.0.0.1", tls_server.server.port, timeout=TIMEOUT, tls_ca=pki.other_ca)


def test_mutual_tls_with_a_secret(mtls_server: ServerThread, pki: TestPKI) -> None:
    port = mtls_server.server.port
    store = mtls_client(port, pki)
    store.set("k", "v")
    assert store.clone().get("k") == b"v"
    store.close()
    # Without a client certificate: refused (TLS 1.3 tells after the handshake).
    with pytest.raises(StoreConnectionError, match=r"client certificate|TLS handshake"):
        TCPStore("127.0.0.1", port, timeout=TIMEOUT, tls_ca=pki.ca, secret=SECRET)
    # The right certificate but the wrong secret: refused.
    with pytest.raises(StoreAuthenticationError):
        mtls_client(port, pki, secret=b"the wrong secret, long enough")


def test_a_tls_master_and_its_clients(pki: TestPKI) -> None:
    master = TCPStore(
        "127.0.0.1",
        0,
        world_size=2,
        is_master=True,
        timeout=TIMEOUT,
        wait_for_workers=False,
        tls_cert=pki.server_cert,
        tls_key=pki.server_key,
        tls_client_ca=pki.ca,
        secret=SECRET,
    )
    try:
        assert master.uses_tls
        client = mtls_client(master.port, pki)
        client.set("from-client", "1")
        assert master.get("from-client") == b"1"
        # A master without tls_ca trusts its own certificate; so does its clone.
        assert master.clone().get("from-client") == b"1"
    finally:
        master.close()


def test_a_connection_that_never_completes_the_tls_handshake_is_dropped(pki: TestPKI) -> None:
    thread = serve(ssl=server_ssl_context(pki.server_cert, pki.server_key), request_timeout=0.5)
    try:
        raw = Raw(thread.server.port, validate=False)  # plain TCP: no ClientHello ever comes
        started = time.monotonic()
        raw.assert_closed()
        assert time.monotonic() - started < 5
    finally:
        thread.stop()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tls_cert": "c.pem"}, "needs tls_ca"),
        ({"tls_client_ca": "ca.pem"}, "needs tls_cert"),
        ({"tls_key": "k.pem"}, "tls_key was given without tls_cert"),
        ({"tls_ca": "/nonexistent/ca.pem"}, "cannot load the server CA file"),
    ],
)
def test_bad_tls_options_are_clear_errors(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TCPStore("127.0.0.1", 1, timeout=1, **kwargs)  # type: ignore[arg-type]


def test_a_tls_master_needs_a_certificate(pki: TestPKI) -> None:
    with pytest.raises(ValueError, match="a master needs tls_cert"):
        TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, tls_ca=pki.ca)


def test_tls_helpers_name_the_file_they_cannot_load(pki: TestPKI, tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ValueError, match=r"bad\.pem"):
        server_ssl_context(bad, pki.server_key)
    with pytest.raises(ValueError, match=r"bad\.pem"):
        client_ssl_context(bad)
    assert isinstance(client_ssl_context(pki.ca), ssl.SSLContext)
    assert TLSConfig(ca=pki.ca).enabled
    assert not TLSConfig().enabled


def test_shared_masters_must_agree_on_security(pki: TestPKI) -> None:
    first = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True, secret=SECRET
    )
    try:
        with pytest.raises(ValueError, match="another secret"):
            TCPStore(
                "127.0.0.1", first.port, is_master=True, multi_tenant=True, secret=SECRET[::-1]
            )
    finally:
        first.close()


def test_no_error_is_logged_by_a_tls_server_serving_a_client(
    tls_server: ServerThread, pki: TestPKI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    store = TCPStore("127.0.0.1", tls_server.server.port, timeout=TIMEOUT, tls_ca=pki.ca)
    store.set("k", "v")
    store.close()
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
