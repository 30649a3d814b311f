"""``DynamicRendezvousHandler``: one node of an elastic rendezvous.

A node posts what it wants to the mailbox and blocks on the key that will hold
the outcome of its round; the steward (any node, see :mod:`.steward`) decides.
While waiting, a node heartbeats and watches the steward's lease, taking it
over when it is vacant or has stopped moving for the liveness bound.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from datetime import timedelta

from tp_rdzv_api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousExhaustedError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousStateError,
    RendezvousStoreInfo,
    RendezvousTimeout,
    RendezvousTimeoutError,
)
from tp_store import PrefixStore, Store, StoreError, StoreTimeoutError, TCPStore

from .backend import RendezvousBackend
from .board import RECEIPT_PREFIX, Lease, RendezvousBoard
from .decisions import Join, Leave
from .events import log_event
from .heartbeats import HEARTBEATS
from .holder import _RendezvousStateHolder
from .node import MAX_ADDR_LENGTH, _NodeDesc, _NodeDescGenerator
from .settings import RendezvousSettings
from .state import RendezvousState, RoundOutcome, encode_closed_outcome
from .status import RendezvousStatus, build_status, decode_liveness
from .steward import Steward

log = logging.getLogger(__name__)

#: How long a node rolling back a timed-out join waits for the steward's receipt.
_ROLLBACK_GRACE = 5.0
_receipts = itertools.count()


class DynamicRendezvousHandler(RendezvousHandler):
    """Coordinate membership, ranks, heartbeats, and round transitions.

    Args:
        backend: where the state document lives.
        settings: the run's settings (``RendezvousSettings(run_id=run_id)``
            when omitted: one node).
        local_addr: this node's address (the FQDN when omitted).
        node_rank: the rank this node asks for; honoured when no other node
            of the round asks for the same one and it is below the world size.
        run_id: the run (or take it from ``settings``).
        store: the store of the run; by default the backend's.
        backend_name: what :meth:`get_backend` returns.
        state_holder: a :class:`_RendezvousStateHolder` (instead of ``backend``).
        node: this node's descriptor (generated when omitted).

    PyTorch's positional form ``(node, settings, backend_name, store,
    state_holder)`` is accepted too. Use :meth:`from_backend` for PyTorch's
    factory.
    """

    _node_desc_generator = _NodeDescGenerator()

    def __init__(  # noqa: PLR0917 - the documented signature
        self,
        backend: RendezvousBackend | _NodeDesc | None = None,
        settings: RendezvousSettings | None = None,
        local_addr: str | None = None,
        node_rank: int = 0,
        run_id: str = "",
        store: Store | None = None,
        backend_name: str = "core",
        state_holder: _RendezvousStateHolder | None = None,
        node: _NodeDesc | None = None,
    ) -> None:
        if isinstance(backend, _NodeDesc):
            # PyTorch's positional form: its backend_name, store and state_holder
            # arrive in the slots of local_addr, node_rank and run_id.
            if node is not None:
                raise TypeError("DynamicRendezvousHandler got the node twice")
            node, backend = backend, None
            slots: tuple[object, object, object] = (local_addr, node_rank, run_id)
            if isinstance(slots[0], str):
                backend_name, local_addr = slots[0], None
            if isinstance(slots[1], Store):
                store, node_rank = slots[1], 0
            if isinstance(slots[2], _RendezvousStateHolder):
                state_holder, run_id = slots[2], ""
        settings = _check_settings(settings, run_id)
        if not isinstance(node_rank, int) or isinstance(node_rank, bool) or node_rank < 0:
            raise ValueError(f"node_rank must be an int >= 0, got {node_rank!r}")
        if local_addr is not None and (
            not isinstance(local_addr, str) or not 0 < len(local_addr) <= MAX_ADDR_LENGTH
        ):
            raise ValueError(
                f"local_addr must be None or a str of 1 to {MAX_ADDR_LENGTH} characters, "
                f"got {local_addr!r:.100}"
            )
        if not isinstance(backend_name, str) or not backend_name:
            raise ValueError(f"backend_name must be a non-empty str, got {backend_name!r}")
        holder = _check_holder(backend, state_holder, settings.run_id)
        if store is None:
            store = getattr(holder.backend, "store", None)
        if not isinstance(store, Store):
            raise TypeError(
                f"DynamicRendezvousHandler needs a tp_store.Store (store=...), got {store!r}"
            )
        if node is None:
            node = self._node_desc_generator.generate(local_addr)
        elif not isinstance(node, _NodeDesc):
            raise TypeError(f"node must be a _NodeDesc, got {node!r}")

        self._node = node
        self._settings = settings
        self._backend_name = backend_name
        self._store = store
        self._holder = holder
        self._hint = node_rank
        self._board = RendezvousBoard(store, settings.run_id)
        self._tick = settings.keep_alive_interval.total_seconds()
        self._steward: Steward | None = None
        self._lease_seen = b""
        self._lease_since = 0.0
        self._lease_epoch = -1
        self._posted_epoch = -1
        self._heartbeat_ticket: int | None = None
        self._round: int | None = None  # the last round this node completed
        self._watcher: RendezvousBoard | None = None  # a connection that may block
        self._ticker: RendezvousBoard | None = None  # the ticks' connection while waiting
        # The round a waiting node asks for (None when not waiting), and with it
        # the lease view and the steward: its ticks run on another thread.
        self._joining: int | None = None
        self._office = threading.Lock()
        # Rank 0's server for the workers of its last round (see _host_bootstrap_store).
        self._bootstrap_server: TCPStore | None = None

    @classmethod
    def from_backend(  # noqa: PLR0917 - PyTorch's signature
        cls,
        run_id: str,
        store: Store,
        backend: RendezvousBackend,
        min_nodes: int,
        max_nodes: int,
        local_addr: str | None = None,
        timeout: RendezvousTimeout | None = None,
        keep_alive_interval: int | float | timedelta = 5,
        keep_alive_max_attempt: int = 3,
    ) -> DynamicRendezvousHandler:
        """A handler for a new node of ``run_id``, as PyTorch's factory builds it.

        ``keep_alive_interval`` is in seconds (or a ``timedelta``).
        """
        settings = RendezvousSettings(
            run_id,
            min_nodes,
            max_nodes,
            timeout or RendezvousTimeout(),
            keep_alive_interval,
            keep_alive_max_attempt,
        )
        return cls(
            backend=backend,
            settings=settings,
            local_addr=local_addr,
            store=store,
            backend_name=backend.name,
        )

    # -- what the agent asks --------------------------------------------------
    @property
    def settings(self) -> RendezvousSettings:
        """The run's settings."""
        return self._settings

    @property
    def node(self) -> _NodeDesc:
        """This node's descriptor."""
        return self._node

    @property
    def round(self) -> int | None:
        """The last round this node completed, or ``None`` before its first."""
        return self._round

    def get_backend(self) -> str:
        """Backend name (e.g. static or core)."""
        return self._backend_name

    def get_run_id(self) -> str:
        """Run identifier of this rendezvous."""
        return self._settings.run_id

    @property
    def use_agent_store(self) -> bool:
        """Whether workers can reuse the agent-held store as their bootstrap store.

        Always: rank 0's handler hosts a fresh store server for every round's
        workers (``bootstrap_store_info``), whatever store the rendezvous is on.
        """
        return True

    def is_closed(self) -> bool:
        """Whether the rendezvous has been marked closed."""
        return self._board.is_closed()

    def num_nodes_waiting(self) -> int:
        """Number of nodes queued for the next round (pending scale-up)."""
        return self._board.waiting()

    def next_rendezvous(self) -> RendezvousInfo:
        """Join or re-join the rendezvous; blocks until this round completes.

        Raises:
            RendezvousClosedError: the rendezvous is closed.
            RendezvousGracefulExitError: it closed while this node was a spare.
            RendezvousExhaustedError: the join timeout passed with fewer than
                ``min_nodes`` gathered (this node's join is rolled back).
            RendezvousTimeoutError: the join timeout passed (rolled back too).
            RendezvousConnectionError: the store failed.
            RendezvousStateError: the stored state is corrupt.
        """
        while True:
            info = self._join_next_round()
            if info is not None:
                return info

    def _join_next_round(self) -> RendezvousInfo | None:
        """This node's next round, or ``None`` when nobody can use it.

        That is when the round's rank 0 died before publishing the workers'
        bootstrap store: no node returned that round, and the caller joins the
        next one.
        """
        self._stop_heartbeats()
        # The agent stopped the workers of the last round before asking again.
        self._close_bootstrap_server()
        board, node = self._board, self._node
        now = started = time.monotonic()
        deadline = now + self._settings.timeout.join.total_seconds()
        board.beat(node)
        # No closed check first: a closed rendezvous has published "closed" as
        # the outcome of the round this node waits for.
        # The round comes with the lease, read before posting: read after, it
        # could already be past the round this join completes.
        round_ = self._watch_lease(now).round
        if self._round is not None:
            # The steward moves the lease's hint only after publishing the
            # outcome: a node calling again at once could read the old hint,
            # have its join taken as a repeat, and get back the round it
            # already holds while the others wait for a new one.
            round_ = max(round_, self._round + 1)
        self._event(logging.DEBUG, "joining", f"{node} joins round {round_}", round_=round_)
        self._post_join(board, round_)
        self._joining = round_
        # While this thread waits for the outcome, the process's scheduler
        # ticks for it (see _tick_while_waiting); nodes started together would
        # tick together: the first tick falls at a random point of the interval.
        ticks = HEARTBEATS.start(
            self._tick_while_waiting, self._tick, first=self._tick * random.uniform(0.5, 1.0)
        )
        try:
            while True:
                now = time.monotonic()
                if now >= deadline:
                    self._stop_ticks(ticks)
                    raise self._roll_back()
                outcome = board.await_outcome(round_, deadline - now)
                if outcome is None:
                    continue
                if outcome.error is not None:
                    raise RendezvousStateError(outcome.error)
                if outcome.closed:
                    raise self._closed_error()
                rank = outcome.ranks.get(node)
                if rank is not None:
                    break
                round_ = outcome.round + 1
                with self._office:
                    self._joining = round_
        finally:
            self._stop_ticks(ticks)
        self._round = outcome.round
        info = self._info(outcome, rank)
        if info is None:
            self._event(
                logging.WARNING,
                "round_abandoned",
                f"round {outcome.round} went stale before its rank 0 published the workers' "
                f"bootstrap store; {node} joins the next round",
                round_=outcome.round,
            )
            return None
        self._event(
            logging.INFO,
            "round_joined",
            f"{node} has rank {rank} of {len(outcome.participants)} in round {outcome.round}",
            duration=time.monotonic() - started,
        )
        self._start_heartbeats()
        return info

    # -- beyond the documented API: for agents and operators -------------------
    def wait_for_change(self, timeout: float) -> bool:
        """Block until the round this node joined no longer describes the job.

        That is: a participant left or died, a node waits to join, a new round
        opened, or the rendezvous closed. Returns ``True`` then (the agent
        should call :meth:`next_rendezvous` again), ``False`` after
        ``timeout`` seconds without change. Before the first round it returns
        ``True`` at once. An event-driven alternative to polling
        :meth:`num_nodes_waiting`; it waits on a connection of its own, so
        heartbeats go on meanwhile.

        Once per ``keep_alive_interval`` it also reads the steward lease and
        takes it over if the steward went silent: when the steward dies with
        the job running, no node is joining to notice, and without a steward
        nobody would ever mark the round stale.
        """
        if self._round is None:
            return True
        if self._watcher is None:
            self._watcher = RendezvousBoard(self._clone_store("a watch"), self.get_run_id())
        deadline = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            self._watch_lease(now)
            if self._watcher.await_stale(self._round, min(self._tick, max(deadline - now, 0))):
                return True
            if time.monotonic() >= deadline:
                return False

    def status(self) -> RendezvousStatus:
        """A snapshot of the run for observers (see :class:`~.status.RendezvousStatus`).

        Read-only: it neither joins nor creates keys. A run with nothing stored
        reads as round 0 with no nodes, and ``exists`` false.
        """
        state = self._holder.observe()
        lease, liveness = self._board.observe()
        ages = {} if liveness is None else decode_liveness(liveness, "the liveness key")
        exists = state is not None or lease is not None
        return build_status(
            self.get_run_id(),
            self._backend_name,
            state or RendezvousState(),
            lease,
            ages,
            exists=exists,
        )

    def set_closed(self) -> None:
        """Mark the rendezvous closed; new joiners are rejected.

        The state is closed first and the ``closed`` key set last, so a node
        that finds the key knows the state is closed and has nothing to do:
        every node of a job may shut down without rewriting the state.
        """
        board = self._board
        if board.is_closed():
            return
        # Every agent shuts down at the end of a job: one of them records the
        # closing, the others wait for its mark instead of racing to rewrite
        # the whole state (and record it themselves if that node vanished).
        close_timeout = self._settings.timeout.close.total_seconds()
        if not board.claim_closing(self._node) and board.await_closed(close_timeout):
            return
        state, token = self._holder.load()
        deadline = time.monotonic() + self._settings.timeout.close.total_seconds()
        while not state.closed:
            if time.monotonic() > deadline:
                raise RendezvousTimeoutError(
                    f"rendezvous {self.get_run_id()!r}: could not record the closing within "
                    f"the close timeout ({self._settings.timeout.close})"
                )
            closed = state.copy()
            closed.closed = True
            state, token, _ = self._holder.save(closed, token)
        # Wake everyone waiting for the open round or the one after it, and
        # the agents watching the completed one.
        first = state.round + 1 if state.complete else state.round
        for round_ in (first, first + 1):
            self._board.publish(round_, encode_closed_outcome(round_))
        if state.complete:
            self._board.mark_stale(state.round)
        self._board.close()
        self._event(logging.INFO, "closed", "the rendezvous is closed", round_=state.round)

    def shutdown(self) -> bool:
        """Release rendezvous resources; returns True when the backend shut down.

        Closes the rendezvous (as PyTorch does), stops the heartbeats and hands
        the steward lease back if this node holds it.
        """
        self._stop_heartbeats()
        try:
            self.set_closed()
        except RendezvousError as exc:
            self._event(logging.WARNING, "shutdown_failed", f"shutdown could not close: {exc}")
            return False
        finally:
            self._stop_steward()
            self._close_bootstrap_server()
            for board in (self._watcher, self._ticker):
                if board is not None:
                    board.store.close()
            self._watcher = self._ticker = None
        return True

    def _event(
        self,
        level: int,
        action: str,
        message: str,
        round_: int | None = None,
        duration: float | None = None,
    ) -> None:
        log_event(
            log,
            level,
            action,
            message,
            run_id=self.get_run_id(),
            node=self._node,
            round_=self._round if round_ is None else round_,
            duration=duration,
        )

    # -- while waiting for an outcome -------------------------------------------
    def _tick_while_waiting(self) -> None:
        """A waiting node's tick, on the scheduler's thread and a connection of its own.

        A heartbeat, the lease (taken over if its steward went silent), and the
        join posted again to a new steward: what the old one took may be lost.
        The node's own thread stays parked on its outcome meanwhile.
        """
        try:
            if self._ticker is None:
                self._ticker = RendezvousBoard(self._clone_store("a tick"), self.get_run_id())
            board = self._ticker
            board.beat(self._node)
            with self._office:
                if self._joining is None:
                    return  # the node has its outcome, or gave up
                self._watch_lease(time.monotonic(), board)
                if self._posted_epoch != self._lease_epoch:
                    self._post_join(board, self._joining)
        except RendezvousError as exc:
            # The node's own wait meets the same store and fails, or times out.
            self._event(logging.WARNING, "heartbeat_failed", f"a tick failed: {exc}")

    def _stop_ticks(self, ticket: int) -> None:
        """No more ticks for the waiting node; returns once one under way is done."""
        HEARTBEATS.stop(ticket)
        with self._office:
            self._joining = None

    def _clone_store(self, what: str) -> Store:
        try:
            return self._store.clone()
        except StoreError as exc:
            raise self._board_error(f"opening a connection for {what}", exc) from exc

    # -- the steward lease ------------------------------------------------------
    def _watch_lease(self, now: float, board: RendezvousBoard | None = None) -> Lease:
        """Read the lease; take it when vacant, ours without a thread, or frozen too long.

        ``board``: the connection to use (the node's own by default). Returns
        the lease as it stands afterwards.
        """
        board = board or self._board
        lease = board.read_lease()
        self._lease_epoch = lease.epoch
        mine = lease.holder == self._node.key
        if lease.raw != self._lease_seen:
            self._lease_seen, self._lease_since = lease.raw, now
        bound = self._settings.liveness_bound.total_seconds()
        if not lease.holder or (mine and not self._steward_running()):
            return self._take_lease(board, lease, now)
        if not mine and now - self._lease_since >= bound:
            self._event(
                logging.WARNING,
                "steward_takeover",
                f"steward {lease.holder} silent for {self._settings.liveness_bound}; "
                f"{self._node} takes over",
            )
            return self._take_lease(board, lease, now)
        return lease

    def _take_lease(self, board: RendezvousBoard, lease: Lease, now: float) -> Lease:
        desired = Lease.encode(lease.epoch + 1, self._node.key, 0, lease.round)
        held = board.swap_lease(lease.raw, desired)
        if held != desired:
            # Another node was faster: it is the steward now.
            winner = Lease.parse(held)
            self._lease_epoch = winner.epoch
            self._lease_seen, self._lease_since = winner.raw, now
            return winner
        self._stop_steward(board)
        store = self._clone_store("the steward")
        steward = Steward(
            self._node,
            self._settings,
            RendezvousBoard(store, self.get_run_id()),
            self._holder.clone(),
            desired,
        )
        steward.start()
        self._steward = steward
        self._lease_epoch = lease.epoch + 1
        self._lease_seen, self._lease_since = desired, now
        return Lease.parse(desired)

    def _steward_running(self) -> bool:
        return self._steward is not None and self._steward.running

    def _stop_steward(self, waker: RendezvousBoard | None = None) -> None:
        """Stop this node's steward; ``waker``: a board whose connection is free."""
        if self._steward is not None:
            self._steward.stop(waker=waker or self._board)
            self._steward = None

    def _board_error(self, what: str, exc: BaseException) -> RendezvousError:
        return RendezvousConnectionError(f"rendezvous {self.get_run_id()!r}: {what}: {exc}")

    # -- joining and giving up --------------------------------------------------------
    def _post_join(self, board: RendezvousBoard, round_: int) -> None:
        board.post(Join(self._node, self._hint, round_))
        self._posted_epoch = self._lease_epoch

    def _closed_error(self) -> RendezvousError:
        """Spares leave gracefully when the rendezvous closes; everyone else is refused."""
        state, _ = self._holder.load()
        if self._node in state.redundancy_list:
            return RendezvousGracefulExitError(
                f"the rendezvous {self.get_run_id()!r} closed while {self._node} was a spare"
            )
        return RendezvousClosedError(f"the rendezvous {self.get_run_id()!r} is closed")

    def _roll_back(self) -> RendezvousError:
        """Withdraw this node after its join timed out; the error to raise."""
        board = self._board
        gathered = board.pending()
        receipt = f"{RECEIPT_PREFIX}{self._node.key}/{next(_receipts)}"
        board.post(Leave(self._node), receipt)
        grace = min(_ROLLBACK_GRACE, self._settings.timeout.close.total_seconds())
        if not board.await_receipt(receipt, grace):
            self._event(
                logging.WARNING,
                "rollback_unconfirmed",
                f"no steward confirmed that {self._node} left; it will be dropped "
                "when its heartbeats stop",
            )
        self._stop_steward()
        timeout = self._settings.timeout.join
        self._event(logging.WARNING, "join_timeout", f"{self._node} gave up after the join timeout")
        if 0 < gathered < self._settings.min_nodes:
            return RendezvousExhaustedError(
                {
                    "min_nodes": self._settings.min_nodes,
                    "joined": gathered,
                    "run_id": self.get_run_id(),
                },
                timeout,
            )
        return RendezvousTimeoutError(
            f"rendezvous {self.get_run_id()!r}: {self._node} did not get a seat within "
            f"the join timeout ({timeout})"
        )

    # -- after a round ----------------------------------------------------------------
    def _info(self, outcome: RoundOutcome, rank: int) -> RendezvousInfo | None:
        """What ``next_rendezvous`` returns; ``None`` if rank 0 died first (see below)."""
        round_store = PrefixStore(f"tp_rdzv/{self.get_run_id()}/r{outcome.round}", self._store)
        if rank == 0:
            bootstrap = self._host_bootstrap_store(round_store)
        else:
            found = self._await_bootstrap_info(rank, round_store, outcome.round)
            if found is None:
                return None
            bootstrap = found
        return RendezvousInfo(
            round_store,
            rank,
            len(outcome.participants),
            bootstrap,
            list(outcome.participants),
            list(outcome.wait_list),
        )

    def _await_bootstrap_info(
        self, rank: int, round_store: Store, round_: int
    ) -> RendezvousStoreInfo | None:
        """The bootstrap store rank 0 publishes; ``None`` if the round turns stale first.

        Rank 0 may die between the outcome and publishing; waiting on would
        make every other node fail with it. Meanwhile this node heartbeats and
        watches the lease as while joining: rank 0 may have been the steward,
        and only a steward marks the round stale.
        """
        keys = [RendezvousStoreInfo.MASTER_ADDR_KEY, RendezvousStoreInfo.MASTER_PORT_KEY]
        deadline = time.monotonic() + self._settings.timeout.join.total_seconds()
        while True:
            try:
                round_store.wait(keys, self._tick)
            except StoreTimeoutError:
                pass
            except StoreError as exc:
                raise self._board_error("waiting for the bootstrap store's address", exc) from exc
            else:
                try:
                    return RendezvousStoreInfo.build(rank, round_store)
                except StoreError as exc:
                    raise self._board_error("reading the bootstrap store's address", exc) from exc
            now = time.monotonic()
            self._board.beat(self._node)
            self._watch_lease(now)
            if self._board.is_stale(round_) and not round_store.check(keys):
                return None
            if now >= deadline:
                raise RendezvousTimeoutError(
                    f"rendezvous {self.get_run_id()!r}: timed out after the join timeout "
                    f"({self._settings.timeout.join}) waiting for rank 0 of round {round_} "
                    "to publish the workers' bootstrap store"
                )

    def _host_bootstrap_store(self, round_store: Store) -> RendezvousStoreInfo:
        """Where the workers of this round bootstrap: an empty store of their own.

        Rank 0 hosts a new server per round and publishes its address in the
        round's namespace, where the other nodes read it. Workers of a
        restarted job so never meet keys of an earlier attempt (gloo's
        addresses, c10d's barriers), as they would on the rendezvous store.
        """
        addr = self._node.addr
        try:
            server = TCPStore(addr, 0, is_master=True, wait_for_workers=False)
        except StoreError as exc:
            # local_addr may reach this node through NAT (a cloud's public name) or
            # not resolve here at all: listen on every interface, as PyTorch's store
            # does; the workers still dial local_addr.
            self._event(
                logging.WARNING,
                "bootstrap_store_on_all_interfaces",
                f"cannot listen on local_addr {addr!r} ({exc}); the workers' bootstrap "
                "store listens on every interface",
            )
            server = self._bootstrap_store_on_all_interfaces()
        self._bootstrap_server = server
        return RendezvousStoreInfo.build(0, round_store, local_addr=addr, server_port=server.port)

    def _bootstrap_store_on_all_interfaces(self) -> TCPStore:
        try:
            return TCPStore("", 0, is_master=True, wait_for_workers=False)
        except StoreError as exc:
            raise RendezvousConnectionError(
                f"rendezvous {self.get_run_id()!r}: cannot host the workers' bootstrap store: {exc}"
            ) from exc

    def _close_bootstrap_server(self) -> None:
        if self._bootstrap_server is not None:
            self._bootstrap_server.close()
            self._bootstrap_server = None

    def _start_heartbeats(self) -> None:
        # The process's scheduler beats for this node until it joins again: no
        # thread per round, and the beats of nodes that returned together spread.
        self._heartbeat_ticket = HEARTBEATS.start(self._beat_once, self._tick)

    def _beat_once(self) -> None:
        try:
            self._board.beat(self._node)
        except RendezvousError as exc:
            self._event(logging.WARNING, "heartbeat_failed", f"heartbeat failed: {exc}")

    def _stop_heartbeats(self) -> None:
        if self._heartbeat_ticket is not None:
            HEARTBEATS.stop(self._heartbeat_ticket)
            self._heartbeat_ticket = None


def _check_settings(settings: object, run_id: object) -> RendezvousSettings:
    if settings is None:
        if not isinstance(run_id, str):
            raise TypeError(f"run_id must be a str, got {run_id!r}")
        settings = RendezvousSettings(run_id=run_id)
    if not isinstance(settings, RendezvousSettings):
        raise TypeError(f"settings must be a RendezvousSettings, got {settings!r}")
    if run_id and run_id != settings.run_id:
        if settings.run_id:
            raise ValueError(
                f"run_id {run_id!r} differs from the settings' run_id {settings.run_id!r}"
            )
        raise ValueError("give the run id in the settings (RendezvousSettings(run_id=...))")
    if not settings.run_id:
        raise ValueError("The run id must be a non-empty string.")
    return settings


def _check_holder(backend: object, state_holder: object, run_id: str) -> _RendezvousStateHolder:
    if state_holder is not None:
        if not isinstance(state_holder, _RendezvousStateHolder):
            raise TypeError(f"state_holder must be a _RendezvousStateHolder, got {state_holder!r}")
        if backend is not None and backend is not state_holder.backend:
            raise TypeError("give a backend or a state_holder, not two different ones")
        return state_holder
    if not isinstance(backend, RendezvousBackend):
        raise TypeError(f"DynamicRendezvousHandler needs a RendezvousBackend, got {backend!r}")
    return _RendezvousStateHolder(backend, run_id)
