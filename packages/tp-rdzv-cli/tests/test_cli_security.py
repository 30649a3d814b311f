"""``tp-rdzv`` with TLS and a shared secret: the installed command in subprocesses.

The store takes ``--tls-cert``, ``--tls-key``, ``--tls-client-ca`` and
``--secret-file``; join, status and close take the same files as ``--config``
keys. The secret is never a command-line value.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import Command, one_line_error, run_tp_rdzv, unique_run_id

from tp_store.testing.tls import TestPKI, make_test_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPKI:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "secret"
    path.write_text("a shared secret, long enough\n")
    path.chmod(0o600)
    return path


def node_config(pki: TestPKI, secret: Path) -> str:
    """The ``--config`` of every node: the node certificate, the CA and the secret file."""
    return (
        f"tls_ca={pki.ca},tls_cert={pki.server_cert},tls_key={pki.server_key},"
        f"secret_file={secret},keep_alive_interval=0.5,last_call_timeout=0.5"
    )


@pytest.fixture
def secure_store(
    tp_rdzv: Callable[..., Command], pki: TestPKI, secret_file: Path
) -> tuple[Command, str]:
    server = tp_rdzv(
        "store",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--json",
        "--tls-cert",
        str(pki.server_cert),
        "--tls-key",
        str(pki.server_key),
        "--tls-client-ca",
        str(pki.ca),
        "--secret-file",
        str(secret_file),
    )
    ready = server.event()
    assert ready["event"] == "listening"
    assert ready["tls"] is True
    assert ready["secret_required"] is True
    return server, str(ready["endpoint"])


def test_join_status_and_close_over_tls_with_a_secret(
    tp_rdzv: Callable[..., Command],
    secure_store: tuple[Command, str],
    pki: TestPKI,
    secret_file: Path,
) -> None:
    _, endpoint = secure_store
    run_id = unique_run_id()
    config = node_config(pki, secret_file)
    node = tp_rdzv(
        "join",
        "--endpoint",
        endpoint,
        "--run-id",
        run_id,
        "--min",
        "1",
        "--max",
        "1",
        "--json",
        "--config",
        config,
    )
    event = node.event()
    assert event["event"] == "round", event
    seen = run_tp_rdzv(
        "status", "--endpoint", endpoint, "--run-id", run_id, "--json", "--config", config
    )
    assert seen.returncode == 0, seen.stderr
    assert json.loads(seen.stdout)["complete"]
    counters = run_tp_rdzv(
        "status", "--endpoint", endpoint, "--store", "--json", "--config", config
    )
    assert counters.returncode == 0, counters.stderr
    assert json.loads(counters.stdout)["connections_open"] >= 1
    closed = run_tp_rdzv("close", "--endpoint", endpoint, "--run-id", run_id, "--config", config)
    assert closed.returncode == 0, closed.stderr
    assert node.event()["event"] == "closed"
    code, err = node.wait()
    assert code == 0, err


def test_a_node_without_the_secret_is_refused_in_one_line(
    secure_store: tuple[Command, str], pki: TestPKI, tmp_path: Path
) -> None:
    _, endpoint = secure_store
    wrong = tmp_path / "wrong"
    wrong.write_text("not the secret, though long enough")
    wrong.chmod(0o600)  # else the store warns that others can read it
    base = f"tls_ca={pki.ca},tls_cert={pki.server_cert},tls_key={pki.server_key}"
    for config, expected in (
        (f"{base},secret_file={wrong}", "authentication failed"),
        (base, "requires a secret"),
    ):
        result = run_tp_rdzv(
            "status", "--endpoint", endpoint, "--run-id", "r", "--timeout", "5", "--config", config
        )
        assert expected in one_line_error(result, 3)


def test_a_node_without_tls_is_refused_in_one_line(
    secure_store: tuple[Command, str], secret_file: Path
) -> None:
    _, endpoint = secure_store
    result = run_tp_rdzv(
        "status",
        "--endpoint",
        endpoint,
        "--run-id",
        "r",
        "--timeout",
        "5",
        "--config",
        f"secret_file={secret_file}",
    )
    assert "does it require TLS" in one_line_error(result, 3)


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (["--secret", "s3cret"], "a secret is never a command-line argument"),
        (["--secret-file", "/nonexistent/secret"], "cannot read the store secret file"),
        (["--tls-key", "key.pem"], "--tls-key and --tls-client-ca need --tls-cert"),
        (["--tls-cert", "/nonexistent/cert.pem"], "cannot load the server certificate"),
        (["--max-connections", "0"], "max_connections"),
        (["--request-timeout", "0"], "request_timeout"),
    ],
)
def test_bad_security_options_of_store_exit_2(arguments: list[str], expected: str) -> None:
    result = run_tp_rdzv("store", "--port", "0", *arguments)
    assert expected in one_line_error(result, 2)


def test_a_bad_security_config_key_exits_2() -> None:
    result = run_tp_rdzv(
        "status", "--endpoint", "127.0.0.1:1", "--run-id", "r", "--config", "tls_ca="
    )
    assert "tls_ca" in one_line_error(result, 2)
