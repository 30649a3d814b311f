"""What a completed rendezvous hands to an agent: ``RendezvousInfo`` and ``RendezvousStoreInfo``."""

from __future__ import annotations

import socket
from typing import Any, ClassVar

from tp_store import PrefixStore, Store, TCPStore

from .errors import RendezvousStateError

#: Hosts that a server binds to but that no client can dial.
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})


def _check_rank(rank: object) -> int:
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise TypeError(f"rank must be an int, got {rank!r}")
    if rank < 0:
        raise ValueError(f"rank must be >= 0, got {rank}")
    return rank


def _check_port(port: object, what: str = "port") -> int:
    if not isinstance(port, int) or isinstance(port, bool):
        raise TypeError(f"{what} must be an int, got {port!r}")
    if not 1 <= port <= 65535:
        raise ValueError(f"{what} must be in 1..65535, got {port}")
    return port


def unwrap_store(store: Store) -> Store:
    """The store under any number of ``PrefixStore`` layers."""
    while isinstance(store, PrefixStore):
        store = store.underlying_store
    return store


def _free_port() -> int:
    """A TCP port that was free a moment ago (bound to port 0, then released)."""
    for family, address in ((socket.AF_INET, ""), (socket.AF_INET6, "::")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((address, 0))
                port: int = sock.getsockname()[1]
                return port
        except OSError:
            continue
    raise OSError("cannot find a free TCP port: binding port 0 failed for IPv4 and IPv6")


class RendezvousStoreInfo:
    """Connection information for the bootstrap store handed to workers.

    Args:
        master_addr: the host name or address of the bootstrap store (non-empty).
        port: its TCP port (1..65535).

    Values compare equal when both fields do; the instances are immutable.
    """

    #: The store key under which rank 0 publishes the address.
    MASTER_ADDR_KEY: ClassVar[str] = "MASTER_ADDR"
    #: The store key under which rank 0 publishes the port.
    MASTER_PORT_KEY: ClassVar[str] = "MASTER_PORT"

    __slots__ = ("_master_addr", "_port")

    def __init__(self, master_addr: str, port: int) -> None:
        if not isinstance(master_addr, str) or not master_addr:
            raise ValueError(f"master_addr must be a non-empty str, got {master_addr!r}")
        self._master_addr = master_addr
        self._port = _check_port(port)

    @property
    def master_addr(self) -> str:
        """The host name or address of the bootstrap store."""
        return self._master_addr

    @property
    def addr(self) -> str:
        """Alias of master_addr."""
        return self._master_addr

    @property
    def port(self) -> int:
        """The TCP port of the bootstrap store."""
        return self._port

    @property
    def master_port(self) -> int:
        """Alias of :attr:`port` (PyTorch's field name)."""
        return self._port

    @classmethod
    def build(
        cls,
        rank: int,
        store: Store,
        local_addr: str | None = None,
        server_port: int | None = None,
    ) -> RendezvousStoreInfo:
        """Derive store info for rank from the rendezvous store.

        Rank 0 owns the address/port pair: it uses the store's own listening
        endpoint when available and otherwise publishes one through the
        store so every other rank can read it.

        Rank 0 picks, in order:

        1. with ``server_port``: ``local_addr``, else the host of the
           (unwrapped) ``TCPStore`` if it is not a wildcard, else
           ``socket.getfqdn()``; and ``server_port``;
        2. when ``store`` is a ``TCPStore`` (possibly under ``PrefixStore``
           layers): its host and port; a wildcard host (``""``,
           ``"0.0.0.0"``, ``"::"``) is replaced by ``local_addr`` or
           ``socket.getfqdn()``;
        3. otherwise ``local_addr`` or ``socket.getfqdn()``, and a free port
           found by binding port 0.

        It writes them to the keys :attr:`MASTER_ADDR_KEY` and
        :attr:`MASTER_PORT_KEY` of ``store``; every other rank reads them,
        blocking (up to the store's timeout) until rank 0 has written them.
        A published value that cannot be parsed raises ``RendezvousStateError``.
        """
        rank = _check_rank(rank)
        if local_addr is not None and not isinstance(local_addr, str):
            raise TypeError(f"local_addr must be a str or None, got {local_addr!r}")
        if server_port is not None:
            server_port = _check_port(server_port, "server_port")
        if rank != 0:
            return cls._read(store)
        base = unwrap_store(store)
        store_host = base.host if isinstance(base, TCPStore) else ""
        if store_host in WILDCARD_HOSTS:
            store_host = ""
        if server_port is not None:
            info = cls(local_addr or store_host or socket.getfqdn(), server_port)
        elif isinstance(base, TCPStore):
            info = cls(store_host or local_addr or socket.getfqdn(), base.port)
        else:
            info = cls(local_addr or socket.getfqdn(), _free_port())
        store.set(cls.MASTER_ADDR_KEY, info.master_addr)
        store.set(cls.MASTER_PORT_KEY, str(info.port))
        return info

    @classmethod
    def _read(cls, store: Store) -> RendezvousStoreInfo:
        raw_addr = store.get(cls.MASTER_ADDR_KEY)
        raw_port = store.get(cls.MASTER_PORT_KEY)
        try:
            return cls(raw_addr.decode(), int(raw_port.decode()))
        except (UnicodeDecodeError, ValueError, TypeError) as exc:
            raise RendezvousStateError(
                f"the bootstrap store address published by rank 0 is malformed: "
                f"{cls.MASTER_ADDR_KEY}={raw_addr!r:.200}, "
                f"{cls.MASTER_PORT_KEY}={raw_port!r:.200} ({exc})"
            ) from exc

    def __eq__(self, other: object) -> bool:
        """Equal when the address and the port are."""
        if not isinstance(other, RendezvousStoreInfo):
            return NotImplemented
        return (self._master_addr, self._port) == (other._master_addr, other._port)

    def __hash__(self) -> int:
        """Hash of the address and the port."""
        return hash((self._master_addr, self._port))

    def __repr__(self) -> str:
        """The constructor call that rebuilds this value."""
        return f"RendezvousStoreInfo(master_addr={self._master_addr!r}, port={self._port})"


class RendezvousInfo:
    """Outcome of a successful rendezvous for one agent.

    Args:
        store: the shared store of this rendezvous round.
        rank: this agent's rank, in ``0..world_size-1``.
        world_size: the number of participating agents (>= 1).
        bootstrap_store_info: where workers find their bootstrap store.
        participants: the nodes of this round, in rank order (copied).
        wait_list: the nodes waiting for a future round (copied).
    """

    __slots__ = (
        "_bootstrap_store_info",
        "_participants",
        "_rank",
        "_store",
        "_wait_list",
        "_world_size",
    )

    def __init__(  # noqa: PLR0917 - the documented positional signature
        self,
        store: Store,
        rank: int,
        world_size: int,
        bootstrap_store_info: RendezvousStoreInfo | None = None,
        participants: list[Any] | None = None,
        wait_list: list[Any] | None = None,
    ) -> None:
        if store is None:
            raise TypeError("RendezvousInfo needs a store, got None")
        rank = _check_rank(rank)
        if not isinstance(world_size, int) or isinstance(world_size, bool):
            raise TypeError(f"world_size must be an int, got {world_size!r}")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if rank >= world_size:
            raise ValueError(f"rank must be < world_size ({world_size}), got {rank}")
        if bootstrap_store_info is not None and not isinstance(
            bootstrap_store_info, RendezvousStoreInfo
        ):
            raise TypeError(
                "bootstrap_store_info must be a RendezvousStoreInfo or None, "
                f"got {bootstrap_store_info!r}"
            )
        self._store = store
        self._rank = rank
        self._world_size = world_size
        self._bootstrap_store_info = bootstrap_store_info
        self._participants = [] if participants is None else list(participants)
        self._wait_list = [] if wait_list is None else list(wait_list)

    @property
    def store(self) -> Store:
        """Shared store for this rendezvous round."""
        return self._store

    @property
    def rank(self) -> int:
        """This agent's rank within the rendezvous."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Number of participating agents."""
        return self._world_size

    @property
    def bootstrap_store_info(self) -> RendezvousStoreInfo | None:
        """Connection info for the worker-facing bootstrap store."""
        return self._bootstrap_store_info

    @property
    def participants(self) -> list[Any]:
        """Nodes participating in this round (a copy, in rank order)."""
        return list(self._participants)

    @property
    def wait_list(self) -> list[Any]:
        """Nodes waiting for a future round (a copy)."""
        return list(self._wait_list)

    def __repr__(self) -> str:
        """Rank, world size, bootstrap info and the node lists (not the store)."""
        return (
            f"RendezvousInfo(rank={self._rank}, world_size={self._world_size}, "
            f"bootstrap_store_info={self._bootstrap_store_info!r}, "
            f"participants={self._participants!r}, wait_list={self._wait_list!r})"
        )
