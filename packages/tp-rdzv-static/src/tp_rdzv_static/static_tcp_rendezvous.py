"""Fixed-size rendezvous over a pre-agreed store endpoint.

All participants agree on ``host:port`` out of band; the node of rank 0 hosts
the store server (a :class:`~tp_store.TCPStore` master) and everyone else
connects to it. Ranks are the node ranks, so this backend suits homogeneous,
statically sized jobs: there is no membership change, no heartbeat and no
restart round; :meth:`StaticTCPRendezvous.next_rendezvous` returns the same
membership every time it is called.
"""

from __future__ import annotations

from tp_rdzv_api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)
from tp_rdzv_api.coercion import to_int, to_seconds
from tp_rdzv_api.config_keys import (
    STORE_SECURITY_KEYS,
    StoreSecurity,
    store_security,
    tcp_store_security,
    warn_unknown_config_keys,
)
from tp_rdzv_api.parameters import TIMEOUT_KEYS
from tp_rdzv_api.timeout import RendezvousTimeout
from tp_rdzv_api.utils import parse_rendezvous_endpoint
from tp_store import PrefixStore, StoreConnectionError, StoreTimeoutError, TCPStore
from tp_store.server.store_server import format_endpoint

__all__ = ["DEFAULT_PORT", "StaticTCPRendezvous", "create_handler", "create_rdzv_handler"]

#: The port used when the endpoint names only a host.
DEFAULT_PORT = 29400
#: Read timeout of the string form, in seconds (the documented default).
_DEFAULT_TIMEOUT = 600
#: Where ``set_closed`` leaves its mark, outside the run's user namespace.
_CLOSED_KEY = "tp_rdzv_static/closed/"
#: The config keys giving the store's read timeout, the first one set wins.
_READ_TIMEOUT_KEYS = ("read_timeout", "timeout", TIMEOUT_KEYS["join"])
#: Every config key backend ``static`` reads; others get a warning.
CONFIG_KEYS = frozenset({"rank", "start_daemon", *_READ_TIMEOUT_KEYS, *STORE_SECURITY_KEYS})


class StaticTCPRendezvous(RendezvousHandler):
    """One-shot rendezvous over a static TCPStore endpoint.

    Two forms, as documented:

    - ``StaticTCPRendezvous(params)`` with :class:`RendezvousParameters`: the
      endpoint is ``params.endpoint`` (port 29400 when it names only a host),
      the rank is the config key ``rank`` when given, else ``params.node_rank``,
      the world size is ``params.max_nodes``, and the store's read timeout is
      the config key ``read_timeout`` (or ``timeout``, as torchrun passes it),
      else ``join_timeout`` (600 s by default). The config key
      ``start_daemon=false`` stops rank 0 from hosting the store (it then
      connects to one started elsewhere). The store is secured as the dynamic
      backends' is (paths of PEM files): ``tls_cert`` and ``tls_key`` (rank 0
      serves TLS with them; the others present them to a store that requires
      client certificates), ``tls_ca`` (connect over TLS, checking the store's
      certificate), ``tls_client_ca`` (rank 0 requires client certificates
      signed by it) and ``secret_file`` (the shared secret; else
      ``TP_STORE_SECRET`` or ``TP_STORE_SECRET_FILE``). Other config keys are
      ignored with a warning naming them.
    - ``StaticTCPRendezvous(host, master_port, rank, world_size, run_id,
      timeout)``: the same, spelled out; ``timeout`` is in seconds.

    Rank 0 binds ``host:port`` (port 0 picks a free one) and returns from its
    constructor at once; the other ranks connect, retrying until the read
    timeout. A failure to bind or connect raises
    :class:`~tp_rdzv_api.RendezvousConnectionError` naming the endpoint.

    Raises:
        ValueError: a malformed endpoint, rank, world size or timeout.
        TypeError: host-name form arguments given along with ``params``.
        RendezvousConnectionError: the endpoint could not be bound or reached.
    """

    def __init__(  # noqa: PLR0917 - the documented positional signature
        self,
        params: RendezvousParameters | str,
        master_port: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        run_id: str = "",
        timeout: int = 600,
    ) -> None:
        is_master: bool
        if isinstance(params, RendezvousParameters):
            if (master_port, rank, world_size, run_id, timeout) != (
                None,
                0,
                1,
                "",
                _DEFAULT_TIMEOUT,
            ):
                raise TypeError(
                    "StaticTCPRendezvous(params): master_port, rank, world_size, run_id and "
                    "timeout come from the RendezvousParameters; do not pass them as well"
                )
            warn_unknown_config_keys(params, "static", CONFIG_KEYS)
            endpoint = params.endpoint.strip()
            config_rank = params.get_as_int("rank")
            self._rank = params.node_rank if config_rank is None else config_rank
            if endpoint:
                self._host, self._port = parse_rendezvous_endpoint(
                    endpoint, default_port=DEFAULT_PORT
                )
            else:  # a single-node job: rank 0 hosts a store on a free port
                self._host, self._port = "localhost", 0
            self._num_nodes = params.max_nodes
            self._run_id = params.run_id
            self._local_addr: str | None = params.local_addr or None
            for key in _READ_TIMEOUT_KEYS:
                if params.get(key) is not None:
                    read_timeout = to_seconds(key, params.get(key)).total_seconds()
                    break
            else:
                read_timeout = RendezvousTimeout().join.total_seconds()
            is_master = self._rank == 0 and bool(params.get_as_bool("start_daemon", True))
            security = store_security(params.config)
        else:
            if not isinstance(params, str):
                raise TypeError(
                    "StaticTCPRendezvous takes RendezvousParameters or a host name, "
                    f"got {type(params).__name__}"
                )
            self._host = params.strip()
            self._port = 0 if master_port is None else to_int("master_port", master_port)
            if not 0 <= self._port <= 65535:
                raise ValueError(f"master_port must be in 0..65535, got {self._port}")
            self._rank = to_int("rank", rank)
            self._num_nodes = to_int("world_size", world_size)
            if not isinstance(run_id, str):  # it prefixes every key of the job
                raise TypeError(f"run_id must be a str, got {type(run_id).__name__} {run_id!r}")
            self._run_id = run_id
            # build() then publishes the store's own host (or this machine's name
            # when the store binds every interface).
            self._local_addr = None
            read_timeout = to_seconds("timeout", timeout).total_seconds()
            is_master = self._rank == 0
            security = StoreSecurity()
        if self._num_nodes < 1:
            raise ValueError(f"the world size must be >= 1, got {self._num_nodes}")
        if not 0 <= self._rank < self._num_nodes:
            raise ValueError(
                f"rank {self._rank} is out of range for a world size of {self._num_nodes} "
                f"(ranks are 0..{self._num_nodes - 1})"
            )
        if self._port == 0 and not is_master:
            raise ValueError(
                f"rank {self._rank} needs the port of the store to connect to; only a rank 0 "
                "that hosts the store may ask for a free port (0)"
            )
        self._is_master = is_master
        self._endpoint = format_endpoint(self._host, self._port)
        self._bootstrap: RendezvousStoreInfo | None = None
        try:
            self._store = TCPStore(
                self._host,
                self._port,
                world_size=self._num_nodes,
                is_master=is_master,
                timeout=read_timeout,
                wait_for_workers=False,
                **tcp_store_security(security, master=is_master),
            )
        except OSError as exc:
            action = "bind" if is_master else "connect to"
            raise RendezvousConnectionError(
                f"static rendezvous: rank {self._rank} failed to {action} the store endpoint "
                f"{self._endpoint}: {exc}"
            ) from exc

    def get_backend(self) -> str:
        """The backend name, ``"static"``."""
        return "static"

    def get_run_id(self) -> str:
        """The run identifier; it prefixes every key of the rendezvous store."""
        return self._run_id

    @property
    def use_agent_store(self) -> bool:
        """True: the store lives in the agent process of rank 0 and workers may reuse it."""
        return True

    def next_rendezvous(self) -> RendezvousInfo:
        """The (fixed) membership: this node's rank, the world size and the shared store.

        The first call also agrees on the bootstrap store (rank 0 publishes
        its store's address, the other ranks wait for it); later calls return
        the same membership again.

        Raises:
            RendezvousClosedError: :meth:`set_closed` was called on some node.
            RendezvousTimeoutError: rank 0 did not publish the bootstrap store in time.
            RendezvousConnectionError: the store could not be reached.
        """
        if self.is_closed():
            raise RendezvousClosedError(
                f"the static rendezvous {self._run_id!r} at {self._endpoint} is closed"
            )
        if self._bootstrap is None:
            try:
                self._bootstrap = RendezvousStoreInfo.build(
                    rank=self._rank,
                    store=self._store,
                    local_addr=self._local_addr,
                    server_port=self._store.port,
                )
            except StoreTimeoutError as exc:
                raise RendezvousTimeoutError(
                    f"static rendezvous: rank {self._rank} timed out waiting for rank 0 to "
                    f"publish the bootstrap store at {self._endpoint}: {exc}"
                ) from exc
            except StoreConnectionError as exc:
                raise self._unreachable(exc) from exc
        return RendezvousInfo(
            store=PrefixStore(self._run_id, self._store),
            rank=self._rank,
            world_size=self._num_nodes,
            bootstrap_store_info=self._bootstrap,
        )

    def is_closed(self) -> bool:
        """Whether any node of this run called :meth:`set_closed`."""
        try:
            return self._store.check([_CLOSED_KEY + self._run_id])
        except StoreConnectionError as exc:
            raise self._unreachable(exc) from exc

    def set_closed(self) -> None:
        """Mark the run closed for every node; :meth:`next_rendezvous` then raises."""
        try:
            self._store.set(_CLOSED_KEY + self._run_id, b"1")
        except StoreConnectionError as exc:
            raise self._unreachable(exc) from exc

    def num_nodes_waiting(self) -> int:
        """Always 0: a static job never admits late joiners."""
        return 0

    def shutdown(self) -> bool:
        """Return True; nothing to release before the process ends.

        The store stays up: on rank 0 it is the agent store that workers may
        still be using. It stops when this handler (and every
        :class:`RendezvousInfo` store from it) is garbage collected.
        """
        return True

    def _unreachable(self, exc: BaseException) -> RendezvousConnectionError:
        return RendezvousConnectionError(
            f"static rendezvous: rank {self._rank} lost the store at {self._endpoint}: {exc}"
        )

    def __repr__(self) -> str:
        role = "host" if self._is_master else "client"
        return (
            f"StaticTCPRendezvous({self._endpoint}, rank={self._rank}, "
            f"world_size={self._num_nodes}, run_id={self._run_id!r}, {role})"
        )


def create_rdzv_handler(params: RendezvousParameters) -> StaticTCPRendezvous:
    """Create the static handler for ``params`` (whose endpoint must be set).

    Raises:
        ValueError: the endpoint is empty, or a parameter is malformed.
        RendezvousConnectionError: the endpoint could not be bound or reached.
    """
    if not params.endpoint.strip():
        raise ValueError(
            "endpoint is absent in RendezvousParameters: the static backend needs host:port "
            "of the store that rank 0 hosts"
        )
    return StaticTCPRendezvous(params)


def create_handler(params: RendezvousParameters) -> StaticTCPRendezvous:
    """The registry entry point of backend ``static`` (same as :func:`create_rdzv_handler`)."""
    return create_rdzv_handler(params)
