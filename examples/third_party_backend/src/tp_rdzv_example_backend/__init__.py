"""An example third-party rendezvous backend: ``example-solo``, a one-node rendezvous.

Everything a backend needs comes from ``tp_rdzv_api`` (and ``tp_store``, which
it depends on): implement :class:`~tp_rdzv_api.RendezvousHandler`, write a
creator taking :class:`~tp_rdzv_api.RendezvousParameters`, and declare the
creator in the ``tensorplay.rendezvous.handlers`` entry-point group.
"""

from __future__ import annotations

from tp_rdzv_api import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
)
from tp_store import HashStore, PrefixStore

__all__ = ["BACKEND", "SoloRendezvousHandler", "create_handler"]

#: The name this backend is registered under.
BACKEND = "example-solo"


class SoloRendezvousHandler(RendezvousHandler):
    """A rendezvous of exactly one node (rank 0 of 1) over an in-process ``HashStore``.

    Args:
        run_id: the run identifier; the store handed out is prefixed with it.
        local_addr: the address published for the workers' bootstrap store.
    """

    def __init__(self, run_id: str, local_addr: str = "127.0.0.1") -> None:
        self._run_id = run_id
        self._local_addr = local_addr
        self._store = HashStore()
        self._closed = False
        self._bootstrap: RendezvousStoreInfo | None = None

    def get_backend(self) -> str:
        """The backend name, ``"example-solo"``."""
        return BACKEND

    def get_run_id(self) -> str:
        """The run identifier."""
        return self._run_id

    def next_rendezvous(self) -> RendezvousInfo:
        """Rank 0 of a world of 1, at once; the same answer on every call.

        Raises:
            RendezvousClosedError: after :meth:`set_closed` or :meth:`shutdown`.
        """
        if self._closed:
            raise RendezvousClosedError(f"the {BACKEND} rendezvous {self._run_id!r} is closed")
        if self._bootstrap is None:
            # The HashStore has no network endpoint, so this publishes
            # local_addr and a free port for the workers' own bootstrap store.
            self._bootstrap = RendezvousStoreInfo.build(0, self._store, local_addr=self._local_addr)
        return RendezvousInfo(
            store=PrefixStore(self._run_id, self._store),
            rank=0,
            world_size=1,
            bootstrap_store_info=self._bootstrap,
            participants=[self._local_addr],
        )

    def is_closed(self) -> bool:
        """Whether :meth:`set_closed` (or :meth:`shutdown`) was called."""
        return self._closed

    def set_closed(self) -> None:
        """Close the rendezvous: :meth:`next_rendezvous` then raises."""
        self._closed = True

    def num_nodes_waiting(self) -> int:
        """Always 0: nobody else can join a solo rendezvous."""
        return 0

    def shutdown(self) -> bool:
        """Close the rendezvous; returns True."""
        self._closed = True
        return True


def create_handler(params: RendezvousParameters) -> SoloRendezvousHandler:
    """The entry point: a :class:`SoloRendezvousHandler` for ``params``.

    Raises:
        ValueError: ``params`` asks for more than one node, a non-zero node
            rank, or names an endpoint (there is no store to reach).
    """
    if params.min_nodes != 1 or params.max_nodes != 1:
        raise ValueError(
            f"the {BACKEND} backend runs exactly one node; got min_nodes={params.min_nodes}, "
            f"max_nodes={params.max_nodes}"
        )
    if params.node_rank != 0:
        raise ValueError(f"the {BACKEND} backend has only rank 0; got node_rank={params.node_rank}")
    if params.endpoint.strip():
        raise ValueError(
            f"the {BACKEND} backend takes no endpoint (its store is in-process); "
            f"got {params.endpoint!r}"
        )
    return SoloRendezvousHandler(params.run_id, params.local_addr or "127.0.0.1")
