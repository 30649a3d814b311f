"""``DynamicRendezvousHandler``: one node of an elastic rendezvous.

A node posts what it wants to the mailbox and blocks on the key that will hold
the outcome of its round; the steward (any node, see :mod:`.steward`) decides.
A node is present through a store session (:mod:`.node.presence`) from its
first rendezvous on; on a store without sessions it heartbeats instead. While
waiting, it watches the steward's lease through its
:class:`~.steward.office.StewardOffice`, which takes the lease over when it is
vacant (at once when its steward's session ended: the session's will wakes the
waiting nodes) or, held without a session, has stopped moving for the
liveness bound.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from tp_rdzv_api import (
    RendezvousConnectionError,
    RendezvousError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousStateError,
    RendezvousTimeout,
)
from tp_store import PrefixStore, Store

from .backends.backend import RendezvousBackend
from .backends.holder import _RendezvousStateHolder
from .documents.answers import Roster, Seat
from .documents.board import VACATED, RendezvousBoard
from .events import log_event
from .model.decisions import Join, Leave
from .model.node_desc import _NodeDesc, _NodeDescGenerator
from .node.arguments import check_arguments
from .node.bootstrap import BootstrapServer, await_bootstrap_info
from .node.closing import close_run, closed_error
from .node.heartbeats import Heartbeats, JoinTicks
from .node.presence import NodePresence
from .node.rollback import roll_back_join
from .node.round_info import RoundInfo
from .node.spares import JoinDeadline
from .settings import RendezvousSettings
from .status import RendezvousStatus, observe_run
from .steward.office import StewardOffice

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Without store sessions, the nodes of this many lowest ranks of a round watch
#: the steward lease between rounds (more than one: one of them may be the steward).
_DEPUTIES = 2


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
        args = check_arguments(
            backend,
            settings,
            local_addr,
            node_rank,
            run_id,
            store,
            backend_name,
            state_holder,
            node,
            self._node_desc_generator,
        )
        self._node = args.node
        self._settings = args.settings
        self._backend_name = args.backend_name
        self._store = args.store
        self._holder = args.holder
        self._hint = args.node_rank
        self._board = RendezvousBoard(args.store, args.settings.run_id)
        self._tick = args.settings.keep_alive_interval.total_seconds()
        self._bootstrap = BootstrapServer(args.node, args.settings.run_id)
        self._office = StewardOffice(
            args.node, args.settings, self._board, args.holder, self._bootstrap
        )
        bound = args.settings.liveness_bound.total_seconds()
        self._presence = NodePresence(self._board, args.node, bound)
        # At least two pings per session timeout (keep_alive_max_attempt may be 1).
        beat_every = min(self._tick, bound / 2)
        self._heartbeats = Heartbeats(args.settings.run_id, args.node, beat_every, self._beat)
        self._ticks = JoinTicks(
            self._board, args.node, self._office, self._tick, self._presence, bound=bound
        )
        self._round: int | None = None  # the last round this node completed
        # Without sessions, the nodes of ranks 0 and 1 watch the lease between rounds.
        self._deputy = False
        self._watcher: RendezvousBoard | None = None  # a connection that may block

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

        Always: one node's handler (the steward's, when it is in the round;
        else rank 0's) hosts a fresh store server for every round's workers
        (``bootstrap_store_info``), whatever store the rendezvous is on.
        """
        return True

    def is_closed(self) -> bool:
        """Whether the rendezvous has been marked closed."""
        return self._retried_if_present_again(self._board.is_closed)

    def num_nodes_waiting(self) -> int:
        """Number of nodes queued for the next round (pending scale-up).

        At least 1 when this node hosts its round's bootstrap store and that
        store's process died: the agent restarts its workers, and the round is
        redone with a new one.
        """
        waiting = self._retried_if_present_again(self._board.waiting)
        return max(waiting, 1) if self._bootstrap.lost() else waiting

    def next_rendezvous(self) -> RendezvousInfo:
        """Join or re-join the rendezvous; blocks until this round completes.

        Raises:
            RendezvousClosedError: the rendezvous is closed.
            RendezvousGracefulExitError: it closed while this node was a spare.
            RendezvousExhaustedError: the join timeout passed with fewer than
                ``min_nodes`` gathered (this node's join is rolled back).
            RendezvousTimeoutError: the join timeout passed (rolled back too).
                Not while this node is a spare (beyond ``max_nodes``, waiting
                for a participant to leave): it waits as long as it takes.
            RendezvousConnectionError: the store failed.
            RendezvousStateError: the stored state is corrupt.
        """
        while True:
            if not self._presence.offered:
                self._heartbeats.stop()  # the join's ticks beat while it waits
            # The agent stopped the workers of the last round before asking again.
            self._bootstrap.close()
            started = time.monotonic()
            seat = self._await_seat()
            self._round = seat.round
            info = self._round_info(seat)
            if info is not None:
                self._event(
                    logging.INFO,
                    "round_joined",
                    f"{self._node} has rank {seat.rank} of {seat.world_size} in round {seat.round}",
                    duration=time.monotonic() - started,
                )
                self._deputy = seat.rank < _DEPUTIES
                self._heartbeats.start(seat.round)
                return info
            # Its rank 0 died before publishing the workers' bootstrap store: no
            # node returned that round, and this one joins the next.
            self._event(
                logging.WARNING,
                "round_abandoned",
                f"round {seat.round} went stale before its rank 0 published the workers' "
                f"bootstrap store; {self._node} joins the next round",
            )

    def _await_seat(self) -> Seat:
        """Post this node's join; its answer in the first round that seats it."""
        board, node = self._board, self._node
        now = time.monotonic()
        # A spare (beyond max_nodes) has no deadline while it waits.
        deadline = JoinDeadline(node, self._holder, self._settings.timeout.join, now)
        counter, round_ = self._retried_if_present_again(functools.partial(self._post_join, now))
        # This thread waits for its answer on the node's connection, which holds
        # its presence session. Under a steward holding the lease through a
        # session it waits for that too (the session's will), and ticks only if
        # the steward left; else it wakes once per interval to tick (the lease
        # watched, the join posted again if needed) and waits again.
        self._ticks.start(Join(node, self._hint, round_), counter, now)
        try:
            while True:
                now = time.monotonic()
                if deadline.expired(now):
                    self._ticks.stop()  # no join posted again after the leave
                    error = roll_back_join(node, self._settings, board, self._round)
                    self._office.stop()  # after the receipt: this node's steward may confirm it
                    raise error
                if self._presence.offered and not self._presence.present and self._present_again():
                    # Its session ended with the connection it lived on (the store
                    # closed it, a request of this thread connected again): present
                    # again, and the join posted again, before a wait that no tick
                    # may interrupt.
                    self._ticks.hurry()
                self._ticks.tick_if_due(now)
                try:
                    found = board.await_round(
                        round_,
                        node,
                        self._ticks.wait(now, deadline.remaining(now)),
                        self._ticks.vacancy(),
                    )
                except RendezvousConnectionError:
                    if not self._present_again():
                        raise
                    self._ticks.hurry()  # found gone: the join goes again at once
                    continue
                if found is None:
                    continue
                if found is VACATED:
                    self._ticks.hurry()  # the steward is gone: the lease, at once
                    continue
                if isinstance(found, Seat):
                    return found
                if found.error is not None:
                    raise RendezvousStateError(found.error)
                if found.closed:
                    raise closed_error(node, self.get_run_id(), self._holder)
                # Complete without this node (a spare): it waits for the next round.
                round_ = found.round + 1
                self._ticks.ask(Join(node, self._hint, round_))
        finally:
            self._ticks.stop()

    def _post_join(self, now: float) -> tuple[int, int]:
        """Be present and post this node's join: the counter whose change means
        the join must go again, and the round joined."""
        # A node that returned a round asks for a later one; a new node for any:
        # the steward reads the round only of a join from a participant.
        asked = 0 if self._round is None else self._round + 1
        join = Join(self._node, self._hint, asked)
        # Present before the join is posted (the steward watches whom it seats),
        # or in the same step, with the lease read in it too, where the store can.
        offered, posted = self._presence.open(join, self._office.claim())
        if offered:
            # A renewal of the session from here on posts the join again.
            counter = self._presence.renewals
            self._heartbeats.start(self._round or 0)
        else:
            counter = self._board.beat(self._node)
        # No closed check first: a closed rendezvous has published "closed" as
        # the outcome of the round this node waits for.
        if posted is not None:
            self._office.posted(posted, now)
            # The round as the join was posted, or just before (the lease may have
            # moved on since: a round that completes without this node is followed
            # by the next, as for a spare).
            round_ = max(posted.round, asked)
            if round_ != asked:
                # Asked for an earlier round than the lease names: if this node is a
                # participant of the completed one (a join whose answer was lost, sent
                # again), the steward takes it as a repeat, and this node would wait
                # for a round that never seats it. Asked again for the named round,
                # it leaves that one and is seated in the next, as any rejoin.
                self._office.post(Join(self._node, self._hint, round_))
        else:
            # The round comes with the lease, read before posting: read after, it
            # could already be past the round this join completes.
            lease = self._office.watch(now)
            # The steward moves the lease's hint only after publishing the
            # outcome: a node calling again at once could read the old hint,
            # have its join taken as a repeat, and get back the round it
            # already holds while the others wait for a new one.
            round_ = max(lease.round, asked)
            self._office.post(Join(self._node, self._hint, round_))
        self._event(logging.DEBUG, "joining", f"{self._node} joins round {round_}", round_=round_)
        return counter, round_

    def _retried_if_present_again(self, operation: Callable[[], _T]) -> _T:
        """``operation()``, once more if it failed because the store had closed this
        node's connection with its presence session (the process was frozen past
        the liveness bound while idle) and the node is present again on a new one.
        The first request after such a close fails: the client cannot tell
        whether the store read it."""
        try:
            return operation()
        except RendezvousConnectionError:
            if not self._present_again():
                raise
            return operation()

    def _present_again(self) -> bool:
        """Whether this node's connection was lost with its presence session, now
        renewed on a new one: the store closes the connection of a session that
        expired (the node, or a store hosted in a node's process, was frozen past
        the liveness bound), and the request under way fails. Raises
        ``RendezvousConnectionError`` if the store cannot be reached."""
        if not self._presence.offered:
            return False
        # The store answers first (on a new connection): one that is gone is an
        # error at once, not a session to renew.
        self._board.is_closed()
        # Renewed here, or already by the scheduler's ping (which found the
        # session's connection gone too).
        self._presence.keep_alive()
        return self._presence.present

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

        It reads the steward lease first and takes it if vacant. Held through
        its steward's store session, the lease needs no more watching: if that
        steward dies, the store deletes the lease and the session's will marks
        the round stale, which ends this wait. Held without a session, the
        lease is read again once per ``keep_alive_interval`` and taken over if
        the steward went silent: when the steward dies with the job running,
        no node is joining to notice, and without a steward nobody would ever
        mark the round stale.
        """
        if self._round is None:
            return True
        if self._watcher is None:
            self._watcher = self._board.clone("a watch connection")
        deadline = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            lease = self._retried_if_present_again(functools.partial(self._office.watch, now))
            wait = max(deadline - now, 0)
            if not lease.session_held:
                wait = min(self._tick, wait)
            if self._watcher.await_stale(self._round, wait):
                # If a dead steward's will woke this wait, the lease is vacant: a
                # steward taking office now removes the dead node and tells the rest.
                self._office.watch(time.monotonic())
                return True
            if time.monotonic() >= deadline:
                return False

    def status(self) -> RendezvousStatus:
        """A snapshot of the run for observers (see :class:`~.status.RendezvousStatus`).

        Read-only: it neither joins nor creates keys. A run with nothing stored
        reads as round 0 with no nodes, and ``exists`` false.
        """
        return self._retried_if_present_again(
            functools.partial(observe_run, self._backend_name, self._holder, self._board)
        )

    def set_closed(self) -> None:
        """Mark the rendezvous closed; new joiners are rejected.

        One node records it (see :func:`~.node.closing.close_run`); the others
        find it recorded and have nothing to do.
        """
        round_ = self._retried_if_present_again(
            functools.partial(close_run, self._node, self._settings, self._board, self._holder)
        )
        if round_ is not None:
            self._event(logging.INFO, "closed", "the rendezvous is closed", round_=round_)

    def shutdown(self) -> bool:
        """Release rendezvous resources; returns True when the backend shut down.

        Closes the rendezvous (as PyTorch does), stops the heartbeats, hands
        the steward lease back if this node holds it, and ends its presence.
        """
        self._heartbeats.stop()
        try:
            self.set_closed()
        except RendezvousError as exc:
            self._event(logging.WARNING, "shutdown_failed", f"shutdown could not close: {exc}")
            return False
        finally:
            self._office.stop()
            self._presence.close()
            self._bootstrap.shutdown()
            if self._watcher is not None:
                self._watcher.store.close()
                self._watcher = None
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

    # -- after a round ----------------------------------------------------------------
    def _round_info(self, seat: Seat) -> RendezvousInfo | None:
        """What ``next_rendezvous`` returns; ``None`` if rank 0 died before publishing."""
        round_store = PrefixStore(self._board.keys.round_store(seat.round), self._store)
        if seat.bootstrap is not None:  # the steward hosts it
            bootstrap = seat.bootstrap
        elif seat.rank == 0:
            try:
                hosted = self._bootstrap.serve(seat.round, self._keep_alive, self._tick)
                bootstrap = self._board.publish_bootstrap(seat.round, hosted)
            except RendezvousError:
                # The others would wait for an address that never comes: this node
                # leaves the round, which goes stale, and they form the next one.
                with contextlib.suppress(RendezvousError):
                    self._board.post(Leave(self._node))
                raise
        else:
            found = await_bootstrap_info(
                seat.round,
                board=self._board,
                settings=self._settings,
                keep_alive=self._keep_alive,
                present_again=self._present_again,
                vacancy=self._ticks.vacancy,
            )
            if found is None:
                return None
            bootstrap = found
        return RoundInfo(round_store, seat, bootstrap, self._read_roster)

    def _read_roster(self, round_: int) -> Roster:
        """The lists of ``round_``, read when ``RendezvousInfo.participants`` is first
        asked for: often the node's first request after its answer, which fails
        if the store closed its connection meanwhile (it was frozen past the
        liveness bound), so it is made again once the node is present again."""
        return self._retried_if_present_again(functools.partial(self._board.read_roster, round_))

    def _keep_alive(self, now: float) -> None:
        """Heartbeat (the presence's pings go on by themselves) and watch the lease, as
        while joining."""
        if not self._presence.offered:
            self._board.beat(self._node)
        self._office.watch(now)

    def _beat(self) -> None:
        """The keep-alive tick, on the scheduler's thread: a ping of the presence
        session; without sessions a heartbeat, and the deputies' look at the lease."""
        if self._presence.offered:
            self._presence.keep_alive()
            return
        self._board.beat(self._node)
        if self._deputy:
            # Without this a steward dying while the job trains would be found only
            # when a node next rendezvouses, and then its own counter timed anew.
            self._office.watch(time.monotonic())
