"""Registry creators for ``core``, ``c10d`` and ``p10d``, and the store they run on.

Config keys (times in seconds; strings from a command line are fine):
``is_host``, ``read_timeout`` (60), ``join_timeout``, ``last_call_timeout``,
``close_timeout``, ``heartbeat_timeout``, ``keep_alive_interval`` (5),
``keep_alive_max_attempt`` (3) and ``store_type`` (``tcp`` or ``file``).
"""

from __future__ import annotations

import socket

from tp_rdzv_api import RendezvousConnectionError, RendezvousParameters
from tp_rdzv_api.coercion import to_seconds
from tp_rdzv_api.utils import parse_rendezvous_endpoint
from tp_store import FileStore, Store, StoreError, TCPStore

from .backend import RendezvousBackend
from .handler import DynamicRendezvousHandler
from .p10d_backend import P10dRendezvousBackend
from .settings import RendezvousSettings
from .tp_backend import TpRendezvousBackend

#: The store port when the endpoint names only a host (PyTorch's default).
DEFAULT_PORT = 29400
_DEFAULT_READ_TIMEOUT = 60.0
_STORE_TYPES = ("tcp", "file")


def create_core_handler(params: RendezvousParameters) -> DynamicRendezvousHandler:
    """Backend ``core``: the dynamic handler on :class:`TpRendezvousBackend` (the default)."""
    return _create(params, "core", TpRendezvousBackend)


def create_c10d_handler(params: RendezvousParameters) -> DynamicRendezvousHandler:
    """Backend ``c10d``: ``core`` under the name torchrun users type."""
    return _create(params, "c10d", TpRendezvousBackend)


def create_p10d_handler(params: RendezvousParameters) -> DynamicRendezvousHandler:
    """Backend ``p10d``: the dynamic handler on :class:`P10dRendezvousBackend`."""
    return _create(params, "p10d", P10dRendezvousBackend)


def _create(
    params: RendezvousParameters,
    name: str,
    backend_type: type[TpRendezvousBackend] | type[P10dRendezvousBackend],
) -> DynamicRendezvousHandler:
    settings = settings_from(params)
    store = create_store(params)
    backend: RendezvousBackend = backend_type(store, params.run_id)
    return DynamicRendezvousHandler(
        backend=backend,
        settings=settings,
        local_addr=params.local_addr,
        node_rank=params.node_rank,
        store=store,
        backend_name=name,
    )


def settings_from(params: RendezvousParameters) -> RendezvousSettings:
    """The :class:`RendezvousSettings` that ``params`` describe."""
    interval = params.get("keep_alive_interval")
    attempts = params.get_as_int("keep_alive_max_attempt", 3)
    assert attempts is not None
    if attempts < 1:
        raise ValueError(
            f"rendezvous config option 'keep_alive_max_attempt' must be >= 1, got {attempts}"
        )
    return RendezvousSettings(
        run_id=params.run_id,
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        timeout=params.timeout,
        keep_alive_interval=None
        if interval is None
        else to_seconds("keep_alive_interval", interval),
        keep_alive_max_attempt=attempts,
    )


def create_store(params: RendezvousParameters) -> Store:
    """The store named by ``params``: a TCPStore (hosted here or not) or a FileStore."""
    store_type = params.get("store_type", "tcp")
    if not isinstance(store_type, str) or store_type.strip().lower() not in _STORE_TYPES:
        raise ValueError(
            f"rendezvous config option 'store_type' must be one of {', '.join(_STORE_TYPES)}, "
            f"got {store_type!r}"
        )
    raw_timeout = params.get("read_timeout")
    read_timeout = (
        _DEFAULT_READ_TIMEOUT
        if raw_timeout is None
        else to_seconds("read_timeout", raw_timeout).total_seconds()
    )
    if store_type.strip().lower() == "file":
        if not params.endpoint.strip():
            raise ValueError("store_type=file needs the endpoint to be the path of the store file")
        return FileStore(params.endpoint.strip(), timeout=read_timeout)
    return _tcp_store(params, read_timeout)


def _tcp_store(params: RendezvousParameters, read_timeout: float) -> TCPStore:
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=DEFAULT_PORT)
    asked = params.get_as_bool("is_host")
    hosting = is_local_address(host) if asked is None else asked
    endpoint = f"{host}:{port}"
    if hosting:
        try:
            # multi_tenant: several nodes of one process share the server.
            return TCPStore(host, port, is_master=True, timeout=read_timeout, multi_tenant=True)
        except StoreError as exc:
            if asked:
                raise RendezvousConnectionError(
                    f"cannot host the rendezvous store at {endpoint}: {exc}"
                ) from exc
            # Guessed from the address: another process of this machine hosts it.
    try:
        return TCPStore(host, port, timeout=read_timeout)
    except StoreError as exc:
        raise RendezvousConnectionError(
            f"cannot reach the rendezvous store at {endpoint}: {exc}"
        ) from exc


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
