"""Registry creator of backend ``etcd``: the dynamic handler on an :class:`EtcdStore`.

The endpoint is a comma-separated list of the cluster's client URLs or
``host[:port]``s (port 2379 by default). Config keys, besides the dynamic
backends' (``read_timeout``, ``join_timeout``, ``last_call_timeout``,
``close_timeout``, ``heartbeat_timeout``, ``keep_alive_interval``,
``keep_alive_max_attempt``):

- ``etcd_prefix``: where the runs live in etcd (default ``/tp_rdzv``); each run
  gets ``<etcd_prefix>/<run_id>/``;
- ``protocol``: ``http`` (default) or ``https``, for endpoints without a scheme;
- ``cacert``, ``cert``, ``key``: PEM files for TLS (CA bundle, client
  certificate and its key);
- ``lease_transport``: how the nodes' presence leases are kept alive:
  ``auto`` (default: one gRPC stream per process), ``grpc``, or ``gateway``
  (a JSON request each, for networks that let only HTTP/1.1 through);
- ``is_host``: false, or absent: no node hosts the store, the etcd cluster is
  it (true is a ``ValueError``; the command line's observers pass false to
  every dynamic backend).

Any other key is ignored with a warning naming it, among them PyTorch's
``etcd-v2`` spellings ``ssl_cert``, ``ssl_cert_key`` and ``ca_cert`` (say
``cert``, ``key`` and ``cacert``), and the TCP store's ``tls_*`` keys;
``timeout``, which PyTorch's launcher passes to every backend, is accepted
silently and not used.

User and password come from the environment only (``TP_RDZV_ETCD_USER`` and
``TP_RDZV_ETCD_PASSWORD``), never from a command line where ``ps`` shows them.
"""

from __future__ import annotations

import os

from tp_rdzv_api import RendezvousParameters
from tp_rdzv_api.coercion import to_seconds
from tp_rdzv_dynamic import DynamicRendezvousHandler
from tp_rdzv_dynamic.documents.layout import RunLayout
from tp_rdzv_dynamic.factory import SETTINGS_KEYS, build_handler

from .endpoints import PROTOCOLS, parse_endpoints
from .store import TRANSPORTS, EtcdStore

USER_ENV = "TP_RDZV_ETCD_USER"
PASSWORD_ENV = "TP_RDZV_ETCD_PASSWORD"
DEFAULT_PREFIX = "/tp_rdzv"
#: As the other dynamic backends: the most one store operation may take.
DEFAULT_READ_TIMEOUT = 60.0
#: The config keys naming the PEM files of TLS: CA bundle, client certificate, its key.
TLS_FILE_KEYS = ("cacert", "cert", "key")
#: The config keys choosing how requests, and how lease keep-alives, reach etcd.
TRANSPORT_KEYS = ("transport", "lease_transport")
#: The config keys :func:`create_store` reads.
STORE_KEYS = frozenset(
    {
        "protocol",
        "etcd_prefix",
        "read_timeout",
        "is_host",
        "transport",
        "lease_transport",
        *TLS_FILE_KEYS,
    }
)
#: Every config key backend ``etcd`` reads; others get a warning.
CONFIG_KEYS = SETTINGS_KEYS | STORE_KEYS


def create_handler(params: RendezvousParameters) -> DynamicRendezvousHandler:
    """Backend ``etcd``: the dynamic handler on :class:`TpRendezvousBackend` over etcd.

    Raises:
        ValueError: a malformed endpoint or config value (naming the key).
    """
    return build_handler(params, "etcd", create_store, config_keys=CONFIG_KEYS)


def create_store(params: RendezvousParameters) -> EtcdStore:
    """The :class:`EtcdStore` of the run ``params`` describe, under its own prefix."""
    if params.get_as_bool("is_host"):
        raise ValueError(
            "rendezvous config option 'is_host' cannot be true for backend 'etcd': "
            "no node hosts the store, the etcd cluster is the store"
        )
    protocol = _text(params, "protocol", "http").lower()
    if protocol not in PROTOCOLS:
        raise ValueError(
            f"rendezvous config option 'protocol' must be http or https, got {protocol!r}"
        )
    try:
        endpoints = parse_endpoints(params.endpoint, protocol)
    except ValueError as exc:
        raise ValueError(f"rendezvous endpoint {params.endpoint!r}: {exc}") from exc
    prefix = _text(params, "etcd_prefix", DEFAULT_PREFIX).rstrip("/")
    if not prefix:
        raise ValueError("rendezvous config option 'etcd_prefix' must not be empty or '/'")
    files = {name: _file(params, name) for name in TLS_FILE_KEYS}
    if (files["cert"] is None) != (files["key"] is None):
        raise ValueError("rendezvous config options 'cert' and 'key' go together")
    user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
    if (user is None) != (password is None):
        raise ValueError(f"set both {USER_ENV} and {PASSWORD_ENV}, or neither")
    raw_timeout = params.get("read_timeout")
    read_timeout = (
        DEFAULT_READ_TIMEOUT
        if raw_timeout is None
        else to_seconds("read_timeout", raw_timeout).total_seconds()
    )
    if read_timeout <= 0:
        raise ValueError(f"rendezvous config option 'read_timeout' must be > 0, got {raw_timeout}")
    transport, lease_transport = (_transport(params, name) for name in TRANSPORT_KEYS)
    store = EtcdStore(
        [endpoint.url for endpoint in endpoints],
        f"{prefix}/{params.run_id}/",
        read_timeout,
        protocol=protocol,
        cacert=files["cacert"],
        cert=files["cert"],
        key=files["key"],
        user=user,
        password=password,
        lease_transport=lease_transport,
        transport=transport,
    )
    # Every node waits for each round's outcome: one watch per process serves them all.
    store.mirror_prefix(RunLayout(params.run_id).outcomes)
    return store


def _transport(params: RendezvousParameters, key: str) -> str:
    value = _text(params, key, "auto").lower()
    if value not in TRANSPORTS:
        raise ValueError(
            f"rendezvous config option {key!r} must be one of {', '.join(TRANSPORTS)}, "
            f"got {value!r}"
        )
    return value


def _text(params: RendezvousParameters, key: str, default: str) -> str:
    value = params.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"rendezvous config option {key!r} must be a string, got {value!r}")
    return value.strip()


def _file(params: RendezvousParameters, key: str) -> str | None:
    value = params.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"rendezvous config option {key!r} must be a file path, got {value!r}")
    if not os.path.isfile(value.strip()):
        raise ValueError(f"rendezvous config option {key!r}: no such file {value!r}")
    return value.strip()
