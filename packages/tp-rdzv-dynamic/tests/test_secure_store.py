"""A rendezvous over a store with TLS and a shared secret, through the config keys.

Nodes are handlers in threads of this process; the first hosts the store
(``is_host=true``), the others connect, all with the same config keys.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tp_rdzv_api import RendezvousConnectionError, RendezvousParameters, create_handler
from tp_rdzv_dynamic import DynamicRendezvousHandler
from tp_rdzv_dynamic.factory import create_store
from tp_store.security import SECRET_ENV, SECRET_FILE_ENV
from tp_store.testing.tls import TestPKI, make_test_pki

NODES = 3


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPKI:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(autouse=True)
def no_secret_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(SECRET_FILE_ENV, raising=False)


@pytest.fixture
def secret_file(tmp_path: Path) -> str:
    path = tmp_path / "secret"
    path.write_text("the job's secret\n")
    return str(path)


def security(pki: TestPKI, secret_file: str) -> dict[str, object]:
    """The config keys every node gets: node certificate, CA, client CA and secret file."""
    return {
        "tls_cert": str(pki.server_cert),
        "tls_key": str(pki.server_key),
        "tls_ca": str(pki.ca),
        "tls_client_ca": str(pki.ca),
        "secret_file": secret_file,
    }


def handler(port: int, is_host: bool, **config: object) -> DynamicRendezvousHandler:
    config.setdefault("last_call_timeout", 0.1)
    config.setdefault("read_timeout", 10)
    created = create_handler(
        RendezvousParameters(
            "core",
            f"127.0.0.1:{port}",
            "secure-job",
            min_nodes=NODES,
            max_nodes=NODES,
            local_addr="127.0.0.1",
            config={"is_host": is_host, **config},
        )
    )
    assert isinstance(created, DynamicRendezvousHandler)
    return created


def test_a_rendezvous_over_tls_with_a_secret(
    free_port: int, pki: TestPKI, secret_file: str
) -> None:
    keys = security(pki, secret_file)
    host = handler(free_port, True, **keys)
    assert host._store.server is not None
    assert host._store.server.ssl is not None
    assert host._store.server.secret == b"the job's secret"
    guests = [handler(free_port, False, **keys) for _ in range(NODES - 1)]
    results: dict[int, tuple[int, int]] = {}
    errors: list[BaseException] = []

    def join(index: int, node: DynamicRendezvousHandler) -> None:
        try:
            info = node.next_rendezvous()
            results[index] = (info.rank, info.world_size)
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=join, args=(index, node))
        for index, node in enumerate([host, *guests])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert sorted(rank for rank, _ in results.values()) == list(range(NODES))
    assert {size for _, size in results.values()} == {NODES}
    stats = host._store.server.stats()
    assert stats["connections_auth_failures"] == 0
    for node in [*guests, host]:
        node.shutdown()


def test_a_wrong_secret_is_a_connection_error(
    free_port: int, pki: TestPKI, secret_file: str, tmp_path: Path
) -> None:
    keys = security(pki, secret_file)
    host = handler(free_port, True, **keys)
    wrong = tmp_path / "wrong"
    wrong.write_text("a guess at the secret")
    try:
        with pytest.raises(RendezvousConnectionError, match="authentication failed"):
            handler(free_port, False, **{**keys, "secret_file": str(wrong)})
        without = {key: value for key, value in keys.items() if key != "secret_file"}
        with pytest.raises(RendezvousConnectionError, match="requires a secret"):
            handler(free_port, False, **without)
        with pytest.raises(RendezvousConnectionError, match="does it require TLS"):
            handler(free_port, False, secret_file=secret_file)
    finally:
        host.shutdown()


def test_the_secret_from_the_environment(free_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "from the environment")
    host = handler(free_port, True)
    try:
        assert host._store.server is not None
        assert host._store.server.secret == b"from the environment"
        monkeypatch.setenv(SECRET_ENV, "another secret, long enough")
        with pytest.raises(RendezvousConnectionError, match="authentication failed"):
            handler(free_port, False)
    finally:
        host.shutdown()


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"tls_ca": ""}, "'tls_ca' must be the path of a file"),
        ({"secret_file": 3}, "'secret_file' must be the path of a file"),
        ({"tls_ca": "/nonexistent/ca.pem", "is_host": False}, "cannot load the server CA file"),
        ({"secret_file": "/nonexistent/secret"}, "cannot read the store secret file"),
    ],
)
def test_bad_security_config_is_named(
    free_port: int, config: dict[str, object], match: str
) -> None:
    params = RendezvousParameters(
        "core", f"127.0.0.1:{free_port}", "job", min_nodes=1, max_nodes=1, config=config
    )
    with pytest.raises(ValueError, match=match):
        create_store(params)


def test_security_keys_are_refused_for_a_file_store(tmp_path: Path) -> None:
    params = RendezvousParameters(
        "core",
        str(tmp_path / "store"),
        "job",
        min_nodes=1,
        max_nodes=1,
        config={"store_type": "file", "secret_file": str(tmp_path / "secret")},
    )
    with pytest.raises(ValueError, match="apply to store_type=tcp only"):
        create_store(params)
