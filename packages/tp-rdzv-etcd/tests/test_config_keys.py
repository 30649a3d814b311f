"""Backend ``etcd``: a warning for the config keys it does not read; ``is_host``; ``transport``.

Real handlers from the registry on a real etcd (``tp_rdzv_etcd.local``).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

from tp_rdzv_api import RendezvousParameters, create_handler
from tp_rdzv_api.config_keys import LAUNCHER_KEYS
from tp_rdzv_api.testing import RecordingConfig, config_key_warnings
from tp_rdzv_dynamic.factory import SETTINGS_KEYS
from tp_rdzv_etcd.client.gateway import EtcdGateway
from tp_rdzv_etcd.client.rpc import EtcdRpc
from tp_rdzv_etcd.client.transport import GrpcOrGateway
from tp_rdzv_etcd.factory import CONFIG_KEYS, STORE_KEYS, TLS_FILE_KEYS, create_store
from tp_rdzv_etcd.local import LocalEtcd


def params(endpoint: str, **config: Any) -> RendezvousParameters:
    config = {"etcd_prefix": f"/config-keys/{uuid.uuid4().hex}", "read_timeout": 10, **config}
    return RendezvousParameters("etcd", endpoint, "run", 1, 1, config=config)


def test_the_known_keys_are_the_ones_read() -> None:
    assert CONFIG_KEYS == SETTINGS_KEYS | STORE_KEYS
    assert set(TLS_FILE_KEYS) == {"cacert", "cert", "key"}
    assert not {"tls_ca", "ssl_cert", "ca_cert", "store_type"} & CONFIG_KEYS


@pytest.mark.parametrize(
    ("config", "named"),
    [
        # PyTorch's etcd-v2 spellings: without the warning, plain http in silence.
        (
            {"ssl_cert": "c.pem", "ssl_cert_key": "k.pem", "ca_cert": "ca.pem"},
            "keys 'ca_cert' (did you mean 'cacert'?), 'ssl_cert', 'ssl_cert_key'",
        ),
        # The TCP store's keys, of backends core, c10d, p10d and static.
        ({"tls_ca": "ca.pem"}, "key 'tls_ca'"),
        ({"store_type": "tcp"}, "key 'store_type'"),
        ({"rank": 0}, "key 'rank'"),
    ],
)
def test_a_key_of_another_backend_gets_one_warning(
    etcd1: LocalEtcd, caplog: pytest.LogCaptureFixture, config: dict[str, Any], named: str
) -> None:
    caplog.set_level(logging.WARNING)
    handler = create_handler(params(etcd1.endpoints, **config))
    handler.shutdown()
    [message] = config_key_warnings(caplog.records)
    assert message == (
        f"rendezvous config {named} not understood by backend 'etcd' and ignored; "
        f"backend 'etcd' understands: {', '.join(sorted(CONFIG_KEYS))}"
    )


def test_the_keys_it_reads_and_torchruns_get_no_warning(
    etcd1: LocalEtcd, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    config = RecordingConfig(
        params(etcd1.endpoints).config,
        protocol="http",
        is_host="false",  # what the command line's observers pass
        join_timeout=30,
        last_call_timeout=0.1,
        close_timeout=5,
        heartbeat_timeout=5,
        keep_alive_interval=1,
        keep_alive_max_attempt=3,
        timeout=900,  # torchrun passes it to every backend
    )
    parameters = params(etcd1.endpoints)
    parameters.config = config
    handler = create_handler(parameters)
    assert handler.next_rendezvous().world_size == 1
    handler.shutdown()
    assert config_key_warnings(caplog.records) == []
    assert config.read <= CONFIG_KEYS | LAUNCHER_KEYS
    assert set(config) - LAUNCHER_KEYS <= config.read


def test_is_host_true_is_an_error() -> None:
    # Checked before anything is dialled: no etcd needed.
    with pytest.raises(ValueError, match="'is_host' cannot be true for backend 'etcd'"):
        create_handler(params("127.0.0.1:1", is_host="yes"))
    with pytest.raises(ValueError, match="'is_host' must be a boolean"):
        create_handler(params("127.0.0.1:1", is_host="maybe"))


@pytest.mark.parametrize("transport", ["grpc", "gateway", "AUTO"])
def test_transport_picks_how_requests_travel(etcd1: LocalEtcd, transport: str) -> None:
    expected = {"grpc": EtcdRpc, "gateway": EtcdGateway, "AUTO": GrpcOrGateway}[transport]
    with create_store(params(etcd1.endpoints, transport=transport)) as store:
        assert isinstance(store._transport, expected)
        store.set("k", "v")  # it works whichever way
        assert store.get("k") == b"v"


def test_a_bad_transport_is_an_error_naming_the_key() -> None:
    with pytest.raises(ValueError, match="'transport' must be one of auto, grpc, gateway"):
        create_handler(params("127.0.0.1:1", transport="carrier-pigeon"))
