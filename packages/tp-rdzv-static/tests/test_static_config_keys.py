"""Backend ``static``'s config keys: a warning for the ones it does not read; TLS and secrets.

Real handlers from the registry, on real stores over loopback.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tp_rdzv_api import RendezvousConnectionError, RendezvousParameters, create_handler
from tp_rdzv_api.config_keys import LAUNCHER_KEYS
from tp_rdzv_api.testing import RecordingConfig, config_key_warnings
from tp_rdzv_static import StaticTCPRendezvous
from tp_rdzv_static.static_tcp_rendezvous import CONFIG_KEYS
from tp_store import StoreAuthenticationError, StoreConnectionError, TCPStore
from tp_store.security import SECRET_ENV, SECRET_FILE_ENV
from tp_store.testing.tls import TestPKI, make_test_pki


@pytest.fixture(autouse=True)
def no_secret_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's shell must not give the stores a secret."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(SECRET_FILE_ENV, raising=False)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPKI:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


def params(port: int, rank: int = 0, world_size: int = 1, **config: Any) -> RendezvousParameters:
    # As torchrun passes them: the rank and the timeout in the config.
    config = {"rank": rank, "timeout": 20, **config}
    return RendezvousParameters(
        "static", f"127.0.0.1:{port}", "run", max_nodes=world_size, config=config
    )


def test_an_unknown_key_gets_a_warning_naming_it(
    free_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    handler = create_handler(params(free_port, secret="x", tls_cax="ca.pem"))
    assert handler.next_rendezvous().world_size == 1
    [message] = config_key_warnings(caplog.records)
    assert message.startswith(
        "rendezvous config keys 'secret', 'tls_cax' (did you mean 'tls_ca'?) not understood "
        "by backend 'static' and ignored; backend 'static' understands: join_timeout, rank, "
        "read_timeout, secret_file, start_daemon, timeout, tls_ca, tls_cert, tls_client_ca, "
        "tls_key"
    )


@pytest.mark.parametrize("key", ["is_host", "store_type", "etcd_prefix", "cacert"])
def test_a_key_of_another_backend_gets_a_warning(
    free_port: int, caplog: pytest.LogCaptureFixture, key: str
) -> None:
    caplog.set_level(logging.WARNING)
    create_handler(params(free_port, **{key: "x"}))
    [message] = config_key_warnings(caplog.records)
    assert f"config key {key!r} not understood by backend 'static'" in message


def test_the_keys_it_reads_and_torchruns_get_no_warning(
    free_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    config = {"read_timeout": 20, "join_timeout": 30, "start_daemon": "true"}
    handler = create_handler(params(free_port, **config))
    handler.next_rendezvous()
    assert config_key_warnings(caplog.records) == []
    # The host-name form has no config: nothing to warn about either.
    StaticTCPRendezvous("127.0.0.1", 0, timeout=20)
    assert config_key_warnings(caplog.records) == []


def test_every_key_it_reads_is_a_known_one(tmp_path: Path, pki: TestPKI, free_port: int) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret-long-enough\n")
    files = {
        "tls_cert": str(pki.server_cert),
        "tls_key": str(pki.server_key),
        "tls_ca": str(pki.ca),
        "tls_client_ca": str(pki.ca),
        "secret_file": str(secret),
    }
    everything = {"rank": 0, "read_timeout": 20, "start_daemon": True, **files}
    config = RecordingConfig(everything, timeout=20, join_timeout=20)
    parameters = params(free_port)
    parameters.config = config
    create_handler(parameters)
    assert config.read <= CONFIG_KEYS | LAUNCHER_KEYS
    assert set(everything) <= config.read


# -- the store's security keys ----------------------------------------------------------------


@pytest.fixture
def tls_pair(free_port: int, pki: TestPKI) -> tuple[StaticTCPRendezvous, ...]:
    tls = {"tls_cert": str(pki.server_cert), "tls_key": str(pki.server_key), "tls_ca": str(pki.ca)}
    host = create_handler(params(free_port, 0, 2, **tls))
    guest = create_handler(params(free_port, 1, 2, tls_ca=str(pki.ca)))
    assert isinstance(host, StaticTCPRendezvous)
    assert isinstance(guest, StaticTCPRendezvous)
    return host, guest


def test_the_store_serves_tls_with_the_tls_keys(
    tls_pair: tuple[StaticTCPRendezvous, ...], free_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    host, guest = tls_pair
    first, second = host.next_rendezvous(), guest.next_rendezvous()
    first.store.set("greeting", "hello")
    assert second.store.get("greeting") == b"hello"
    assert config_key_warnings(caplog.records) == []
    # A node without tls_ca cannot talk to the store in plain TCP.
    with pytest.raises(StoreConnectionError, match=r"does it require TLS \(tls_ca\)"):
        TCPStore("127.0.0.1", free_port, timeout=5)
    with pytest.raises(RendezvousConnectionError, match="does it require TLS"):
        create_handler(params(free_port, 1, 2, read_timeout=5))


def test_rank_0_can_require_client_certificates(
    free_port: int, pki: TestPKI, caplog: pytest.LogCaptureFixture
) -> None:
    server = {"tls_cert": str(pki.server_cert), "tls_key": str(pki.server_key)}
    client = {"tls_cert": str(pki.client_cert), "tls_key": str(pki.client_key)}
    host = create_handler(
        params(free_port, 0, 2, tls_client_ca=str(pki.ca), tls_ca=str(pki.ca), **server)
    )
    # The same tls_client_ca on a guest is ignored: only the host serves.
    guest = create_handler(
        params(free_port, 1, 2, tls_ca=str(pki.ca), tls_client_ca=str(pki.ca), **client)
    )
    host.next_rendezvous()
    assert guest.next_rendezvous().rank == 1
    with pytest.raises(RendezvousConnectionError, match=r"client certificate|TLS handshake"):
        create_handler(params(free_port, 1, 2, read_timeout=5, tls_ca=str(pki.ca)))
    assert config_key_warnings(caplog.records) == []


def test_secret_file_is_required_of_every_node(free_port: int, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret-long-enough\n")
    host = create_handler(params(free_port, 0, 2, secret_file=str(secret)))
    guest = create_handler(params(free_port, 1, 2, secret_file=str(secret)))
    host.next_rendezvous()
    assert guest.next_rendezvous().rank == 1
    with pytest.raises(StoreAuthenticationError, match="requires a secret"):
        TCPStore("127.0.0.1", free_port, timeout=5)


@pytest.mark.parametrize("bad", ["", 7])
def test_a_security_key_that_is_not_a_path_is_an_error(free_port: int, bad: object) -> None:
    with pytest.raises(ValueError, match="'tls_ca' must be the path of a file"):
        create_handler(params(free_port, tls_ca=bad))
