"""The workers' bootstrap store of a round: the steward or rank 0 hosts it.

A new server per round, so workers of a restarted job never meet keys of an
earlier attempt (gloo's addresses, c10d's barriers), as they would on the
rendezvous store. The steward hosts it when it is a participant of the round
it completes: it writes the address in every participant's answer, which
the nodes read anyway, so nobody waits for it. Otherwise (a steward that is
a spare, or one that could not listen) rank 0 hosts it and publishes its
address and port in one key of the run (``bootstrap/<round>``), which the
other nodes wait for in one request.

The server runs in a child process of the agent (:mod:`.bootstrap_child`),
started when this node first becomes the steward or hosts a round (under
torchrun, with the handler) and kept for the next rounds: a
flood of its port cannot delay the agent's keep-alive, what the workers store
(within :data:`~.bootstrap_child.BOOTSTRAP_LIMITS`) cannot grow the agent's
memory, and the child dies with the agent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from tp_rdzv_api import RendezvousConnectionError, RendezvousStoreInfo, RendezvousTimeoutError
from tp_rdzv_dynamic.documents.board import STALE, RendezvousBoard
from tp_rdzv_dynamic.events import log_event
from tp_rdzv_dynamic.model.node_desc import _NodeDesc
from tp_rdzv_dynamic.settings import RendezvousSettings

from .bootstrap_process import BootstrapProcess, BootstrapProcessError, describe_exit

log = logging.getLogger(__name__)


class BootstrapServer:
    """This node's store server for the workers of the last round it hosted, in a
    child process (used by the node's own thread and by its steward's)."""

    def __init__(self, node: _NodeDesc, run_id: str) -> None:
        self._node = node
        self._run_id = run_id
        self._lock = threading.Lock()
        self._process: BootstrapProcess | None = None
        self._round: int | None = None  # the round whose workers it serves
        self._lost_reported = False

    def serve(
        self, round_: int, keep_alive: Callable[[float], object], tick: float
    ) -> RendezvousStoreInfo:
        """Start an empty server for the workers of ``round_``; its address.

        ``keep_alive(now)`` runs every ``tick`` seconds while the child is slow
        to answer (starting, on a loaded machine): the node stays alive meanwhile.

        Raises ``RendezvousConnectionError`` when ``local_addr`` cannot be
        bound (never a fallback to every interface) or the child fails.
        """
        addr = self._node.addr
        if not addr or any(char.isspace() for char in addr):
            raise self._error(f"cannot listen on local_addr {addr!r}: not a host name or address")
        with self._lock:
            process = self._running_process(round_)
            try:
                port = process.host(addr, keep_alive, tick)
            except BootstrapProcessError as exc:
                raise self._error(
                    f"{exc} (local_addr must name an address of this host; the workers' "
                    "bootstrap store never falls back to every interface)"
                ) from exc
            self._round = round_
            self._lost_reported = False
        return RendezvousStoreInfo(addr, port)

    def prestart(self) -> None:
        """Start the process now (without waiting for it), not with the first round hosted."""
        with self._lock:
            if self._process is None:
                self._process = self._start()

    def lost(self) -> bool:
        """Whether the server of this node's round died with its process (logged once)."""
        with self._lock:
            process = self._process
            if self._round is None or process is None:
                return False
            status = process.exit_status()
            if status is None:
                return False
            if not self._lost_reported:
                self._lost_reported = True
                log_event(
                    log,
                    logging.ERROR,
                    "bootstrap_store_lost",
                    f"the workers' bootstrap store of round {self._round} died with its "
                    f"process (pid {process.pid}, {describe_exit(status)}); the round is redone",
                    run_id=self._run_id,
                    node=self._node,
                    round_=self._round,
                )
            return True

    def close(self) -> None:
        """Stop the server (the agent stopped the workers of its round); the process stays."""
        with self._lock:
            if self._process is not None and self._round is not None:
                self._process.close_server()
            self._round = None

    def shutdown(self) -> None:
        """Stop the server and its process."""
        with self._lock:
            self._round = None
            if self._process is not None:
                self._process.stop()
                self._process = None

    def _running_process(self, round_: int) -> BootstrapProcess:
        process = self._process
        if process is not None:
            status = process.exit_status()
            if status is None:
                return process
            log_event(
                log,
                logging.WARNING,
                "bootstrap_store_restarted",
                f"the process of the workers' bootstrap store (pid {process.pid}) had exited "
                f"({describe_exit(status)}); starting another",
                run_id=self._run_id,
                node=self._node,
                round_=round_,
            )
            process.stop()
        self._process = self._start()
        return self._process

    def _start(self) -> BootstrapProcess:
        try:
            return BootstrapProcess()
        except OSError as exc:
            raise self._error(f"cannot start its process: {exc}") from exc

    def _error(self, detail: str) -> RendezvousConnectionError:
        return RendezvousConnectionError(
            f"rendezvous {self._run_id!r}: the workers' bootstrap store: {detail}"
        )


def await_bootstrap_info(
    round_: int,
    *,
    board: RendezvousBoard,
    settings: RendezvousSettings,
    keep_alive: Callable[[float], object],
    present_again: Callable[[], bool],
    vacancy: Callable[[], int | None],
) -> RendezvousStoreInfo | None:
    """The bootstrap store rank 0 of ``round_`` publishes; ``None`` if the round turns stale first.

    Rank 0 may die between the outcome and publishing; waiting on would make
    every other node fail with it. The wait ends at the round's stale mark
    too, where the store can wait for either, and at the vacancy of the
    steward's lease (``vacancy()``: its epoch, or ``None``): then
    ``keep_alive(now)`` runs at once (the node watches the lease as while
    joining: rank 0 may have been the steward, and only a steward marks the
    round stale). It runs once per keep-alive interval otherwise (once per
    liveness bound while the wait covers the vacancy), and the round's stale
    mark is read then. A wait that fails with the node's connection, which the
    store closed with its expired presence session, goes on once
    ``present_again()`` says the node is present again.
    """
    interval = settings.keep_alive_interval.total_seconds()
    bound = settings.liveness_bound.total_seconds()
    deadline = time.monotonic() + settings.timeout.join.total_seconds()
    while True:
        epoch = vacancy()
        tick = interval if epoch is None else bound
        left = max(deadline - time.monotonic(), 0.0)
        try:
            found = board.await_bootstrap(round_, min(tick, left), epoch)
        except RendezvousConnectionError:
            if not present_again():
                raise
            found = None
        if isinstance(found, RendezvousStoreInfo):
            return found
        if found is STALE:
            return None
        now = time.monotonic()
        keep_alive(now)
        # The wait covered the stale mark, unless the store cannot wait for either.
        stale_unseen = found is None and not board.waits_for_either
        if stale_unseen and board.is_stale(round_) and not board.has_bootstrap(round_):
            return None
        if now >= deadline:
            raise RendezvousTimeoutError(
                f"rendezvous {board.run_id!r}: timed out after the join timeout "
                f"({settings.timeout.join}) waiting for rank 0 of round {round_} "
                "to publish the workers' bootstrap store"
            )
