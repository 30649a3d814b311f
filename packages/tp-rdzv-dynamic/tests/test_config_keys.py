"""Backends core, c10d and p10d: a warning for the config keys they do not read.

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
from tp_rdzv_dynamic.factory import CONFIG_KEYS, SECURITY_KEYS, SETTINGS_KEYS, STORE_KEYS

BACKENDS = ["core", "c10d", "p10d"]


def params(backend: str, endpoint: str, **config: Any) -> RendezvousParameters:
    return RendezvousParameters(
        backend, endpoint, "job", min_nodes=1, max_nodes=1, local_addr="127.0.0.1", config=config
    )


def test_the_known_keys_are_the_ones_read() -> None:
    assert CONFIG_KEYS == SETTINGS_KEYS | STORE_KEYS
    assert set(SECURITY_KEYS) <= STORE_KEYS
    assert {"is_host", "read_timeout", "store_type", "join_timeout", "keep_alive_interval"} <= (
        CONFIG_KEYS
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_unknown_key_gets_one_warning_naming_it(
    backend: str, free_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    handler = create_handler(params(backend, f"127.0.0.1:{free_port}", is_host=True, secret="x"))
    handler.shutdown()
    [message] = config_key_warnings(caplog.records)
    assert message == (
        f"rendezvous config key 'secret' not understood by backend {backend!r} and ignored; "
        f"backend {backend!r} understands: {', '.join(sorted(CONFIG_KEYS))}"
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("key", ["rank", "start_daemon", "etcd_prefix", "cacert", "ssl_cert"])
def test_a_key_of_another_backend_gets_a_warning(
    backend: str, key: str, free_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    handler = create_handler(params(backend, f"127.0.0.1:{free_port}", is_host=True, **{key: "1"}))
    handler.shutdown()
    [message] = config_key_warnings(caplog.records)
    assert f"config key {key!r} not understood by backend {backend!r}" in message


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_keys_it_reads_and_torchruns_get_no_warning(
    backend: str, free_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    config = {
        "is_host": "true",
        "read_timeout": 20,
        "store_type": "tcp",
        "join_timeout": 30,
        "last_call_timeout": 0.1,
        "close_timeout": 5,
        "heartbeat_timeout": 5,
        "keep_alive_interval": 1,
        "keep_alive_max_attempt": 3,
        "stable_ranks": "true",
        "timeout": 900,  # torchrun passes it to every backend
    }
    handler = create_handler(params(backend, f"127.0.0.1:{free_port}", **config))
    assert handler.next_rendezvous().world_size == 1
    handler.shutdown()
    assert config_key_warnings(caplog.records) == []


def test_the_warning_comes_before_the_store_fails(
    free_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    # A misspelled TLS key may be why the store cannot be reached: say so first.
    caplog.set_level(logging.WARNING)
    config = {"is_host": False, "read_timeout": 0.3, "tls_cax": "ca.pem"}
    with pytest.raises(RendezvousConnectionError):
        create_handler(params("c10d", f"127.0.0.1:{free_port}", **config))
    [message] = config_key_warnings(caplog.records)
    assert message.startswith(
        "rendezvous config key 'tls_cax' (did you mean 'tls_ca'?) not understood by backend "
        "'c10d' and ignored"
    )


@pytest.mark.parametrize("store_type", ["tcp", "file"])
def test_every_key_it_reads_is_a_known_one(
    store_type: str, free_port: int, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    endpoint = f"127.0.0.1:{free_port}" if store_type == "tcp" else str(tmp_path / "store")
    settings = {
        "join_timeout": 30,
        "last_call_timeout": 0.1,
        "close_timeout": 5,
        "heartbeat_timeout": 5,
        "keep_alive_interval": 1,
        "keep_alive_max_attempt": 3,
        "stable_ranks": False,
    }
    store = {"store_type": store_type, "read_timeout": 20}
    if store_type == "tcp":
        store["is_host"] = True
    config = RecordingConfig(settings, **store, timeout=900)
    parameters = params("core", endpoint)
    parameters.config = config
    handler = create_handler(parameters)
    handler.shutdown()
    assert config.read <= CONFIG_KEYS | LAUNCHER_KEYS
    assert set(settings) | set(store) | set(SECURITY_KEYS) <= config.read
    assert config_key_warnings(caplog.records) == []
