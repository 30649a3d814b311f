"""The workers' bootstrap store of a round: rank 0 hosts it, the other nodes find it.

Rank 0 hosts a new server per round and publishes its address in the round's
namespace, where the other nodes read it. Workers of a restarted job so never
meet keys of an earlier attempt (gloo's addresses, c10d's barriers), as they
would on the rendezvous store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tp_rdzv_api import RendezvousConnectionError, RendezvousStoreInfo, RendezvousTimeoutError
from tp_rdzv_dynamic.documents.board import RendezvousBoard
from tp_rdzv_dynamic.events import log_event
from tp_rdzv_dynamic.model.node_desc import _NodeDesc
from tp_rdzv_dynamic.settings import RendezvousSettings
from tp_store import Store, StoreError, StoreTimeoutError, TCPStore

log = logging.getLogger(__name__)

_ADDRESS_KEYS = [RendezvousStoreInfo.MASTER_ADDR_KEY, RendezvousStoreInfo.MASTER_PORT_KEY]


class BootstrapServer:
    """Rank 0's store server for the workers of its last round."""

    def __init__(self, node: _NodeDesc, run_id: str) -> None:
        self._node = node
        self._run_id = run_id
        self._server: TCPStore | None = None

    def host(self, round_store: Store, round_: int) -> RendezvousStoreInfo:
        """Start an empty server for the workers of ``round_``; the address to publish."""
        addr = self._node.addr
        try:
            server = TCPStore(addr, 0, is_master=True, wait_for_workers=False)
        except StoreError as exc:
            # local_addr may reach this node through NAT (a cloud's public name) or
            # not resolve here at all: listen on every interface, as PyTorch's store
            # does; the workers still dial local_addr.
            log_event(
                log,
                logging.WARNING,
                "bootstrap_store_on_all_interfaces",
                f"cannot listen on local_addr {addr!r} ({exc}); the workers' bootstrap "
                "store listens on every interface",
                run_id=self._run_id,
                node=self._node,
                round_=round_,
            )
            server = self._on_all_interfaces()
        self._server = server
        return RendezvousStoreInfo.build(0, round_store, local_addr=addr, server_port=server.port)

    def close(self) -> None:
        """Stop the server (the agent stopped the workers of its round)."""
        if self._server is not None:
            self._server.close()
            self._server = None

    def _on_all_interfaces(self) -> TCPStore:
        try:
            return TCPStore("", 0, is_master=True, wait_for_workers=False)
        except StoreError as exc:
            raise RendezvousConnectionError(
                f"rendezvous {self._run_id!r}: cannot host the workers' bootstrap store: {exc}"
            ) from exc


def await_bootstrap_info(
    rank: int,
    round_store: Store,
    round_: int,
    *,
    board: RendezvousBoard,
    settings: RendezvousSettings,
    keep_alive: Callable[[float], object],
) -> RendezvousStoreInfo | None:
    """The bootstrap store rank 0 of ``round_`` publishes; ``None`` if the round turns stale first.

    Rank 0 may die between the outcome and publishing; waiting on would make
    every other node fail with it. Meanwhile ``keep_alive(now)`` runs once per
    keep-alive interval (the node heartbeats and watches the lease as while
    joining: rank 0 may have been the steward, and only a steward marks the
    round stale).
    """
    tick = settings.keep_alive_interval.total_seconds()
    deadline = time.monotonic() + settings.timeout.join.total_seconds()
    while True:
        try:
            round_store.wait(_ADDRESS_KEYS, tick)
        except StoreTimeoutError:
            pass
        except StoreError as exc:
            raise _store_error(board, "waiting for the bootstrap store's address", exc) from exc
        else:
            try:
                return RendezvousStoreInfo.build(rank, round_store)
            except StoreError as exc:
                raise _store_error(board, "reading the bootstrap store's address", exc) from exc
        now = time.monotonic()
        keep_alive(now)
        if board.is_stale(round_) and not round_store.check(_ADDRESS_KEYS):
            return None
        if now >= deadline:
            raise RendezvousTimeoutError(
                f"rendezvous {board.run_id!r}: timed out after the join timeout "
                f"({settings.timeout.join}) waiting for rank 0 of round {round_} "
                "to publish the workers' bootstrap store"
            )


def _store_error(board: RendezvousBoard, what: str, exc: StoreError) -> RendezvousConnectionError:
    return RendezvousConnectionError(f"rendezvous {board.run_id!r}: {what}: {exc}")
