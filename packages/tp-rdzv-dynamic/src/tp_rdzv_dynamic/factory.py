"""Registry creators for ``core``, ``c10d`` and ``p10d``, and the store they run on.

Config keys (times in seconds; strings from a command line are fine):
``is_host``, ``read_timeout`` (60; 300 for a file store, PyTorch's FileStore
timeout), ``join_timeout``, ``last_call_timeout``,
``close_timeout``, ``heartbeat_timeout``, ``keep_alive_interval`` (5),
``keep_alive_max_attempt`` (3), ``stable_ranks`` (a bool, off by default:
survivors keep their ranks from round to round, see
:meth:`~.settings.RendezvousSettings.with_stable_ranks`) and ``store_type`` (``tcp`` or
``file``; with ``file`` the endpoint is the file's path, and an empty
endpoint a new temporary file).

Securing the TCP store (paths of PEM files; see ``tp_store.TCPStore``):

- ``tls_cert``, ``tls_key``: the hosting node serves TLS with them; other
  nodes present them to a store that requires client certificates;
- ``tls_ca``: the CA of the store's certificate; with it a node connects
  over TLS and checks the certificate against the endpoint's host;
- ``tls_client_ca``: the hosting node requires client certificates signed by it;
- ``secret_file``: a file holding the shared secret every node must prove
  (else ``TP_STORE_SECRET`` or ``TP_STORE_SECRET_FILE`` from the environment).
  The secret itself is never a config value: configs end up on command lines.

The same keys work for every node: give them all ``tls_cert``, ``tls_key``
and ``tls_ca``. A wrong or missing secret, or a failed TLS handshake, is a
``RendezvousConnectionError`` naming the store.

Any other key is ignored with a warning naming it (see
:func:`tp_rdzv_api.config_keys.warn_unknown_config_keys`), except ``timeout``,
which PyTorch's launcher passes to every backend.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable, Collection

from tp_rdzv_api import RendezvousConnectionError, RendezvousParameters
from tp_rdzv_api.coercion import to_seconds
from tp_rdzv_api.config_keys import (
    STORE_SECURITY_KEYS,
    StoreSecurity,
    store_security,
    tcp_store_security,
    warn_unknown_config_keys,
)
from tp_rdzv_api.parameters import TIMEOUT_KEYS
from tp_rdzv_api.utils import parse_rendezvous_endpoint
from tp_store import FileStore, Store, TCPStore

from .backends._store_backend import check_run_id
from .backends.backend import RendezvousBackend
from .backends.p10d_backend import P10dRendezvousBackend
from .backends.tp_backend import TpRendezvousBackend
from .handler import DynamicRendezvousHandler
from .settings import RendezvousSettings

#: The store port when the endpoint names only a host (PyTorch's default).
DEFAULT_PORT = 29400
_DEFAULT_READ_TIMEOUT = 60.0
#: A file store's timeout unless ``read_timeout`` is given: PyTorch's FileStore default.
_DEFAULT_FILE_TIMEOUT = 300.0
_STORE_TYPES = ("tcp", "file")
#: Config keys naming files that secure the TCP store, as TCPStore's keyword arguments.
SECURITY_KEYS = STORE_SECURITY_KEYS
#: The config keys :func:`settings_from` reads (every dynamic backend, ``etcd`` too).
SETTINGS_KEYS = frozenset(
    {*TIMEOUT_KEYS.values(), "keep_alive_interval", "keep_alive_max_attempt", "stable_ranks"}
)
#: The config keys :func:`create_store` reads.
STORE_KEYS = frozenset({"store_type", "read_timeout", "is_host", *SECURITY_KEYS})
#: Every config key backends ``core``, ``c10d`` and ``p10d`` read; others get a warning.
CONFIG_KEYS = SETTINGS_KEYS | STORE_KEYS


def create_core_handler(params: RendezvousParameters) -> DynamicRendezvousHandler:
    """Backend ``core``: the dynamic handler on :class:`TpRendezvousBackend` (the default)."""
    return build_handler(params, "core", create_store)


def create_c10d_handler(params: RendezvousParameters) -> DynamicRendezvousHandler:
    """Backend ``c10d``: ``core`` under the name torchrun users type."""
    return build_handler(params, "c10d", create_store)


def create_p10d_handler(params: RendezvousParameters) -> DynamicRendezvousHandler:
    """Backend ``p10d``: the dynamic handler on :class:`P10dRendezvousBackend`."""
    return build_handler(params, "p10d", create_store, P10dRendezvousBackend)


def build_handler(
    params: RendezvousParameters,
    name: str,
    open_store: Callable[[RendezvousParameters], Store],
    backend_type: type[TpRendezvousBackend] | type[P10dRendezvousBackend] = TpRendezvousBackend,
    *,
    config_keys: Collection[str] = CONFIG_KEYS,
) -> DynamicRendezvousHandler:
    """The dynamic handler ``params`` describe, as backend ``name``, on ``open_store(params)``.

    ``config_keys`` are the config keys this backend reads (its settings' and
    ``open_store``'s): any other key of ``params`` is named in a warning. The
    settings are checked before the store opens; the store is closed again if
    the handler cannot be built. Other backends (``etcd``) build on this.
    PyTorch's ``RendezvousParameters`` (what torchrun passes) are converted
    first (:meth:`RendezvousParameters.convert`).
    """
    params = RendezvousParameters.convert(params)
    warn_unknown_config_keys(params, name, config_keys)
    # Before any store is opened or hosted: the run id becomes part of its keys.
    check_run_id(params.run_id, "rendezvous")
    settings = settings_from(params)
    store = open_store(params)
    try:
        backend: RendezvousBackend = backend_type(store, params.run_id)
        return DynamicRendezvousHandler(
            backend=backend,
            settings=settings,
            local_addr=params.local_addr,
            node_rank=params.node_rank,
            store=store,
            backend_name=name,
        )
    except BaseException:
        store.close()
        raise


def settings_from(params: RendezvousParameters) -> RendezvousSettings:
    """The :class:`RendezvousSettings` that ``params`` describe."""
    interval = params.get("keep_alive_interval")
    attempts = params.get_as_int("keep_alive_max_attempt", 3)
    assert attempts is not None
    if attempts < 1:
        raise ValueError(
            f"rendezvous config option 'keep_alive_max_attempt' must be >= 1, got {attempts}"
        )
    stable_ranks = params.get_as_bool("stable_ranks", False)
    assert stable_ranks is not None
    return RendezvousSettings(
        run_id=params.run_id,
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        timeout=params.timeout,
        keep_alive_interval=None
        if interval is None
        else to_seconds("keep_alive_interval", interval),
        keep_alive_max_attempt=attempts,
    ).with_stable_ranks(stable_ranks)


def create_store(params: RendezvousParameters) -> Store:
    """The store named by ``params``: a TCPStore (hosted here or not) or a FileStore."""
    store_type = params.get("store_type", "tcp")
    if not isinstance(store_type, str) or store_type.strip().lower() not in _STORE_TYPES:
        raise ValueError(
            f"rendezvous config option 'store_type' must be one of {', '.join(_STORE_TYPES)}, "
            f"got {store_type!r}"
        )
    is_file = store_type.strip().lower() == "file"
    raw_timeout = params.get("read_timeout")
    read_timeout = (
        (_DEFAULT_FILE_TIMEOUT if is_file else _DEFAULT_READ_TIMEOUT)
        if raw_timeout is None
        else to_seconds("read_timeout", raw_timeout).total_seconds()
    )
    security = store_security(params.config)
    if is_file:
        if security:
            raise ValueError(
                f"rendezvous config options {', '.join(sorted(security))} apply to "
                "store_type=tcp only"
            )
        return _file_store(params.endpoint.strip(), read_timeout)
    return _tcp_store(params, read_timeout, security)


#: What opening a store may raise that means "no store here", as PyTorch's c10d
#: factory wraps them: a store error (a RuntimeError), an OS error (no thread or
#: socket left, a path it cannot open). A ValueError from a TCPStore is a bad
#: option (a TLS or secret file that cannot be read) and stays one, named.
_STORE_FAILURES = (RuntimeError, OSError)
#: A file store also meets the OS's ValueError: a path with a NUL byte.
_FILE_STORE_FAILURES = (*_STORE_FAILURES, ValueError)


def _file_store(path: str, read_timeout: float) -> FileStore:
    """The FileStore at ``path``; with no path, in a new temporary file (as PyTorch)."""
    try:
        if not path:
            # Readable and writable by this user only; one node: nobody else knows the path.
            descriptor, path = tempfile.mkstemp(prefix="tp-rdzv-")
            os.close(descriptor)
        return FileStore(path, timeout=read_timeout)
    except _FILE_STORE_FAILURES as exc:
        raise RendezvousConnectionError(
            f"cannot open the rendezvous file store {path!r}: {exc}"
        ) from exc


def _tcp_store(
    params: RendezvousParameters, read_timeout: float, security: StoreSecurity
) -> TCPStore:
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=DEFAULT_PORT)
    asked = params.get_as_bool("is_host")
    hosting = is_local_address(host) if asked is None else asked
    endpoint = f"{host}:{port}"
    if hosting:
        try:
            # multi_tenant: several nodes of one process share the server.
            return _open_tcp_store(host, port, read_timeout, security, master=True)
        except _STORE_FAILURES as exc:
            if asked:
                raise RendezvousConnectionError(
                    f"cannot host the rendezvous store at {endpoint}: {exc}"
                ) from exc
            # Guessed from the address: another process of this machine hosts it.
    try:
        return _open_tcp_store(host, port, read_timeout, security, master=False)
    except _STORE_FAILURES as exc:
        raise RendezvousConnectionError(
            f"cannot reach the rendezvous store at {endpoint}: {exc}"
        ) from exc


def _open_tcp_store(
    host: str, port: int, read_timeout: float, security: StoreSecurity, *, master: bool
) -> TCPStore:
    return TCPStore(
        host,
        port,
        is_master=master,
        timeout=read_timeout,
        # Several nodes of one process share the server.
        multi_tenant=master,
        **tcp_store_security(security, master=master),
    )


def is_local_address(host: str) -> bool:
    """Whether ``host`` names this machine: binding one of its addresses works."""
    try:
        addresses = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, address in addresses:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((address[0], 0))
        except OSError:
            continue
        return True
    return False
