"""The steward: the executor that applies the decisions for the whole run.

It runs in a thread of the node holding the lease, on store connections of its
own: it waits for the mailbox, takes what is there in one batch, runs the
last-call timer on this host's monotonic clock, asks
:func:`~tp_rdzv_dynamic.model.decisions.apply` for the next state, persists it
with compare-and-set, then publishes what the nodes wait for.

Departures reach it two ways. A node present through a store session (the
default store) is gone when the store pushes that session's will into the
mailbox: the steward blocks on the mailbox and reads nothing per node while a
job trains. Only the members without a presence key (stores without
sessions) are watched by sampling their heartbeat counters, four times per
interval.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from tp_rdzv_api import RendezvousError, RendezvousStateError, RendezvousStoreInfo
from tp_rdzv_dynamic.backends.holder import _RendezvousStateHolder
from tp_rdzv_dynamic.documents.board import RendezvousBoard
from tp_rdzv_dynamic.documents.codecs import (
    LivenessReport,
    Mail,
    decode_outcome,
    encode_liveness,
)
from tp_rdzv_dynamic.events import log_event
from tp_rdzv_dynamic.model.decisions import (
    Event,
    Join,
    Leave,
    Transition,
    apply,
    needs_last_call,
)
from tp_rdzv_dynamic.model.gone import Gone
from tp_rdzv_dynamic.model.node_desc import _NodeDesc
from tp_rdzv_dynamic.model.state import RendezvousState, RoundOutcome
from tp_rdzv_dynamic.settings import RendezvousSettings

from .liveness import LivenessTracker
from .tenure import LeaseLost, Tenure

log = logging.getLogger(__name__)

#: How many times a batch is re-applied after losing a compare-and-set race.
_MAX_RETRIES = 16
#: Heartbeat samples per keep-alive interval. A beat is seen at most this
#: fraction of an interval after it lands, so a dead node is found within the
#: liveness bound plus a quarter interval (sampling once per interval, it took
#: up to two intervals more).
_SCANS_PER_TICK = 4


class BootstrapHost(Protocol):
    """Where this node hosts the workers' bootstrap store of a round
    (:class:`~tp_rdzv_dynamic.node.bootstrap.BootstrapServer`)."""

    def prestart(self) -> None:
        """Start the store's process now, without waiting for it."""

    def serve(
        self, round_: int, keep_alive: Callable[[float], object], tick: float
    ) -> RendezvousStoreInfo:
        """A new, empty store for the workers of ``round_``; ``keep_alive(now)`` runs
        every ``tick`` seconds while it starts."""
        ...


class Steward:
    """Decides for the run while ``node`` holds the lease (``tenure``).

    Args:
        node: this node.
        settings: the run's settings.
        board: the side channels, on a store connection of the steward's own.
        holder: the state holder, on a backend connection of the steward's own.
        tenure: the lease this node took, on ``board``.
        suspect: the key of the node whose steward went silent for the liveness
            bound (the takeover's reason): its heartbeat counter is judged
            dead after one interval without moving instead of the whole bound.
        bootstrap: hosts the workers' bootstrap store of a round this node
            is a participant of, named in every answer (``None``: rank 0
            hosts it and publishes it for the others to wait for).
    """

    def __init__(
        self,
        node: _NodeDesc,
        settings: RendezvousSettings,
        board: RendezvousBoard,
        holder: _RendezvousStateHolder,
        tenure: Tenure,
        *,
        suspect: str | None = None,
        bootstrap: BootstrapHost | None = None,
    ) -> None:
        self.node = node
        self.settings = settings
        self.board = board
        self.holder = holder
        self._tenure = tenure
        self._tick = settings.keep_alive_interval.total_seconds()
        self._scan_every = self._tick / _SCANS_PER_TICK
        bound = settings.liveness_bound.total_seconds()
        # At least two beats (or pings) per liveness bound: keep_alive_max_attempt may be 1.
        self._beat_every = min(self._tick, bound / 2)
        self._liveness = LivenessTracker(bound)
        self._suspect = suspect
        self._bootstrap = bootstrap
        # Members watched through their presence sessions (their departures come as
        # mail); the others' heartbeat counters are sampled.
        self._present: set[str] = set()
        self._reported_present: frozenset[str] | None = None  # none yet: report at once
        self._sampling = True  # whether some member is watched by its counter
        self._stop = threading.Event()
        self._state = RendezvousState()  # what this steward decided
        self._saved = self._state  # what the backend holds
        self._unsaved: list[Event] = []  # events applied since the last save
        # The mailbox messages of the batch under way, until persisted (or left to their senders).
        self._taken: list[tuple[Mail, str | None]] = []
        self._token: object = None
        self._last_call_at: float | None = None
        self._liveness_report: bytes | None = None  # published with the next counters
        self._stale_round = -1  # the last completed round marked stale
        self._will_round = -1  # the last completed round the steward's session marks if it ends
        self._thread = threading.Thread(
            target=self._run, name=f"tp-rdzv-steward-{node}", daemon=True
        )

    # -- lifetime ---------------------------------------------------------------
    def start(self) -> None:
        """Start deciding in the background."""
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether the steward still decides (it stops when it loses the lease)."""
        return self._thread.is_alive()

    def stop(self, waker: RendezvousBoard) -> None:
        """Stop deciding and hand the lease back; returns once the thread ended.

        ``waker`` is a board on another connection than the steward's (which
        its own blocked wait holds): the wake-up message goes through it.
        """
        self._stop.set()
        # If the store is gone, the thread ends at its next timeout instead.
        with contextlib.suppress(RendezvousError):
            waker.wake()
        self._thread.join(timeout=self._tick + 5)

    def _run(self) -> None:
        try:
            self._take_office()
            while not self._stop.is_set():
                self._step()
            self._tenure.resign(self._round_hint())
        except LeaseLost:
            self._event(logging.INFO, "lease_lost", f"steward {self.node} lost the lease")
        except RendezvousStateError as exc:
            log.error("rendezvous %r: steward %s stopped: %s", self.board.run_id, self.node, exc)
            self._report(exc)
        except RendezvousError as exc:
            log.warning("rendezvous %r: steward %s stopped: %s", self.board.run_id, self.node, exc)
        finally:
            self._hand_back()
            self._tenure.close()
            self.board.store.close()
            self.holder.close()

    # -- the steps ----------------------------------------------------------------
    def _take_office(self) -> None:
        """Load the state and stamp it with this epoch, which fences older stewards out."""
        if not self._tenure.session_held:  # the office's attempt failed
            self._tenure.hold_through_session()
        if self._bootstrap is not None:
            # Its process starts (a Python interpreter) while the joins come in,
            # not while the nodes wait for the answers that name it.
            with contextlib.suppress(RendezvousError):  # then hosting fails, and rank 0 hosts
                self._bootstrap.prestart()
        state, token = self.holder.load()
        for _ in range(_MAX_RETRIES):
            self._state = state
            if state.epoch >= self._tenure.epoch:
                # The lease was reset or damaged: move it past the state's epoch.
                self._tenure.move_past(state.epoch, state.waiting_round)
            stamped = state.copy()
            stamped.epoch = self._tenure.epoch
            stored, token, won = self.holder.save(stamped, token)
            if won:
                self._state = self._saved = stamped
                self._token = token
                break
            state = stored
        else:
            raise LeaseLost
        now = time.monotonic()
        self._next_scan = self._next_report = self._next_flush = now
        self._next_beat = now + self._beat_every
        state = self._state
        self._watch_presence(list(state.members()))
        self._refresh_sampling()
        if self._suspect is not None:
            self._liveness.suspect(self._suspect, now, self._tick)
        self._publish_counters()  # before any node is told (see _announce)
        if state.complete:
            # Before any node is told (see _step).
            self._leave_will(state)
            key = self.board.keys.outcome(state.round)
            outcome = state.outcome()
            published = self.board.publish(outcome, functools.partial(self._bootstrap_for, outcome))
            try:
                members = decode_outcome(published, key).world_size
            except RendezvousStateError as exc:
                # Not what a steward wrote: its nodes must rendezvous again.
                log.warning("rendezvous %r: a corrupt round outcome: %s", self.board.run_id, exc)
                members = -1
            # A predecessor may have changed the round without telling its nodes.
            if members != len(state.participants):
                self._mark_stale(state.round)
            else:
                self._check_stale(state)
        self._tenure.hint(self._round_hint())
        self._update_last_call(now)
        self._event(
            logging.INFO,
            "steward_elected",
            f"{self.node} is the steward (epoch {self._tenure.epoch}, round {state.round})",
        )

    def _step(self) -> None:
        now = time.monotonic()
        wake_at = self._next_beat
        if self._unsaved:
            wake_at = min(wake_at, self._next_flush)
        if self._sampling:
            wake_at = min(wake_at, self._next_scan)
        if self._last_call_at is not None:
            wake_at = min(wake_at, self._last_call_at)
        events: list[Event] = []
        receipts: list[str] = []
        dead: list[Leave] = []
        if self.board.await_mail(max(wake_at - now, 0.0)):
            self._taken = [
                (event, receipt)
                for event, receipt in self.board.take_mail()
                if event is not None  # not a wake-up
            ]
            receipts = [receipt for _, receipt in self._taken if receipt is not None]
            if self._taken:
                # The lease moves before deciding (a storm of joins takes a while at
                # thousands of nodes: waiters could judge this steward silent), and
                # the move tells whether it still holds it. A node posts its join
                # again only when the lease's epoch moves past the one it read
                # before posting: if another node took the lease before this drain,
                # only this steward knows of what it took (``_hand_back``).
                self._beat()
            events.extend(self._events(self._taken))
        now = time.monotonic()
        if self._sampling and now >= self._next_scan:
            dead = self._find_dead(now)
            events.extend(dead)
            self._next_scan = now + self._scan_every
        flush = bool(self._unsaved) and now >= self._next_flush
        if flush:
            self._next_flush = now + self._tick
        expired = self._last_call_at is not None and now >= self._last_call_at
        if events or expired or flush:
            self._decide(events, expired, flush=flush)
        elif self._liveness_report is not None:
            self._publish_counters()
        if dead:
            # After the leave is persisted: a node found dead that was only
            # slow sees its counter start again at its next beat and re-posts
            # its join, instead of waiting out its join timeout unseated.
            self.board.reset_heartbeats([event.node for event in dead])
        self.board.confirm(receipts)
        self._beat_if_due()

    def _events(self, mail: list[tuple[Mail, str | None]]) -> list[Event]:
        """The events of a batch of mail: a departure the store announced is a leave,
        unless its node is present again through another session."""
        events: list[Event] = []
        # After the closing (recorded by any node), departures change nothing: the
        # job is over and its nodes end their sessions as they shut down; a save
        # for each batch of them would be for nothing.
        over = any(isinstance(message, Gone) for message, _ in mail) and (
            self._state.closed or self.board.is_closed()
        )
        joining: set[_NodeDesc] = set()
        for message, _ in mail:
            if not isinstance(message, Gone):
                events.append(message)
                if isinstance(message, Join):
                    joining.add(message.node)
            elif over:
                continue
            elif not self._is_member(message.node, joining):
                # A node that already left (the will of a session it shared with
                # other nodes of its process fires when that session ends), or a
                # member of a completed round whose survivors opened the next
                # one without it before its departure came.
                self._event(
                    logging.DEBUG,
                    "departure_ignored",
                    f"node {message.node} is gone; it is in no round",
                    about=message.node,
                )
            elif self.board.present_again(message):
                self._event(
                    logging.INFO,
                    "presence_renewed",
                    f"node {message.node} is present through a new session; it stays",
                    about=message.node,
                )
            else:
                self._present.discard(message.node.key)
                self._event(
                    logging.WARNING,
                    "node_gone",
                    f"node {message.node} is gone (its presence session ended); removing it",
                    about=message.node,
                )
                events.append(Leave(message.node))
        joiners = [
            event.node
            for event in events
            if isinstance(event, Join) and event.node.key not in self._present
        ]
        self._watch_presence(joiners)
        return events

    def _is_member(self, node: _NodeDesc, joining: set[_NodeDesc]) -> bool:
        """Whether ``node`` is in the state, or ``joining`` in the batch under way."""
        state = self._state
        return node in joining or any(
            node in listed
            for listed in (state.participants, state.wait_list, state.redundancy_list)
        )

    def _watch_presence(self, nodes: list[_NodeDesc]) -> None:
        """Watch those of ``nodes`` that have a presence key through their sessions.

        One round trip when all have one (as on a store with sessions). A node
        without one has its heartbeat counter sampled, and is dead if it does
        not move within an interval: on a store with sessions that is a node
        whose session ended and whose departure this steward never got (a
        predecessor drained it and died, or put back a join it posted before
        dying); a client without sessions beats every interval.
        """
        if not nodes or not self._tenure.session_held:
            return
        if self.board.all_present(nodes):
            self._present.update(node.key for node in nodes)
            return
        now = time.monotonic()
        for node in nodes:
            if self.board.all_present([node]):
                self._present.add(node.key)
            elif not self._liveness.tracks(node.key):
                self._liveness.suspect(node.key, now, self._tick)

    def _refresh_sampling(self, events: list[Event] | None = None) -> None:
        """After the membership changed: whether some member's counter must be sampled.

        Without leaves (or the closing), every node watched is still a member and
        the counts tell: no pass over the members per batch of joins.
        """
        state = self._state
        count = len(state.participants) + len(state.wait_list) + len(state.redundancy_list)
        left = events is None or any(isinstance(event, Leave) for event in events)
        if left or state.closed or len(self._present) > count:
            self._present &= {node.key for node in state.members()}
        self._sampling = len(self._present) < count

    def _beat(self) -> None:
        self._tenure.beat(self._round_hint())
        self._next_beat = time.monotonic() + self._beat_every

    def _beat_if_due(self) -> None:
        if time.monotonic() < self._next_beat:
            return
        if self._tenure.session_held:
            self._tenure.keep_alive()  # a ping of its session, not a write
            self._next_beat = time.monotonic() + self._beat_every
        else:
            self._beat()

    def _hand_back(self) -> None:
        """Return to the mailbox the batch under way when this steward stopped.

        It stops in a batch when it lost the lease or the store failed; that
        batch may hold messages nobody will post again: those of nodes that
        read a new steward's epoch before posting, and leaves (their senders
        never post them again). Dead-node leaves this steward found are not
        messages: the next steward finds those nodes itself.
        """
        if not self._taken:
            return
        try:
            self.board.put_back(self._taken)
        except RendezvousError as exc:
            log.warning(
                "rendezvous %r: steward %s could not return %d messages to the mailbox: %s",
                self.board.run_id,
                self.node,
                len(self._taken),
                exc,
            )

    def _find_dead(self, now: float) -> list[Leave]:
        """Sample the counters of the members without a presence key; those silent
        for the liveness bound are dead. Reports the ages once per interval."""
        members = [node for node in self._state.members() if node.key not in self._present]
        unseen = [node for node in members if not self._liveness.tracks(node.key)]
        counters = self.board.sample_heartbeats(members, unseen)
        by_key = {node.key: node for node in members}
        silent = self._liveness.observe(dict(zip(by_key, counters, strict=True)), now)
        if now >= self._next_report:
            self._next_report = now + self._tick
            self._liveness_report = encode_liveness(
                LivenessReport(self._liveness.ages(now), frozenset(self._present))
            )
        for key in silent:
            log_event(
                log,
                logging.WARNING,
                "node_dead",
                f"node {key} missed its heartbeats for {self.settings.liveness_bound}; removing it",
                run_id=self.board.run_id,
                node=key,
                round_=self._state.round,
            )
        return [Leave(by_key[key]) for key in silent]

    def _decide(self, events: list[Event], last_call_expired: bool, flush: bool) -> None:
        """Apply ``events``; persist at once if a round ends or opens, a node leaves, or
        nodes join a completed round (late joiners and spares: the state shows them
        at once, to the agents of that round and to ``status()``).

        Joins gathered for the open round are only persisted at the next tick
        (``flush``) or with its completion: a new steward gets them again from
        the nodes, which re-post to every new steward, so persisting each batch
        would only make a storm of joins rewrite the whole state once per batch.
        """
        self._unsaved.extend(events)
        before = self._state
        started = time.monotonic()
        transition = apply(self._state, events, self.settings, last_call_expired=last_call_expired)
        self._state = transition.state
        urgent = (
            bool(transition.outcomes or transition.opened)
            or self._state.complete
            or any(isinstance(event, Leave) for event in events)
        )
        if self._state == self._saved:
            self._unsaved.clear()  # nothing to persist: the backend holds this state
        elif urgent or flush:
            transition = self._save(transition, last_call_expired)
        # Only joins to the open round can still be unsaved. Their senders read
        # this steward's lease before posting (it was still this steward's after
        # the drain), so they post them again to the next steward.
        self._taken = []
        self._refresh_sampling(events)
        for round_ in transition.completed:
            self._event(
                logging.INFO,
                "round_decided",
                f"round {round_} decided and saved",
                round_,
                duration=time.monotonic() - started,
            )
        if transition.completed:
            # The will first: a node returns as soon as its answer is written, and
            # its agent must learn of this steward's death from then on.
            self._leave_will(self._state)
        self._announce(transition)
        if before.complete and before.round != self._stale_round:
            self._check_stale(before)
        self._leave_will(self._state)
        self._update_last_call(time.monotonic())

    def _leave_will(self, state: RendezvousState) -> None:
        """Have the completed round of ``state`` marked stale if this steward's session
        ends: the agents of that round in ``wait_for_change`` wake then and rendezvous
        again, and one of them takes the vacant lease."""
        if state.complete and state.round not in (self._will_round, self._stale_round):
            self._tenure.mark_stale_when_ended(state.round)
            self._will_round = state.round

    def _check_stale(self, completed: RendezvousState) -> None:
        """Mark the ``completed`` round stale if the state has moved on from it.

        It has when a participant left, a node waits to join, the rendezvous
        closed, or a new round opened: its nodes should rendezvous again.
        Participants only ever leave a completed round, so comparing counts
        is enough.
        """
        state = self._state
        if (
            state.round != completed.round
            or state.closed
            or state.wait_list
            or len(state.participants) != len(completed.participants)
        ):
            self._mark_stale(completed.round)

    def _mark_stale(self, round_: int) -> None:
        self.board.mark_stale(round_)
        self._stale_round = round_
        self._event(logging.INFO, "round_stale", f"round {round_} is stale", round_)

    def _save(self, transition: Transition, last_call_expired: bool) -> Transition:
        """Persist the state; after losing a race, rebuild on the winner's and retry."""
        for _ in range(_MAX_RETRIES):
            stored, token, won = self.holder.save(self._state, self._token)
            self._token = token
            if won:
                self._saved = self._state
                self._unsaved.clear()
                return transition
            # Someone else wrote (set_closed): what this steward has not saved
            # yet is decided again on top of theirs.
            if stored.epoch > self._tenure.epoch:
                raise LeaseLost
            transition = apply(
                stored, self._unsaved, self.settings, last_call_expired=last_call_expired
            )
            self._state = transition.state
        raise LeaseLost

    def _announce(self, transition: Transition) -> None:
        """Publish the counters, then the outcomes of the rounds that completed.

        A node returns from its round on its answer and may ask at once how
        many nodes wait (the agent's scale-up check): the counters must
        already be those of the state that completed it.
        """
        self._publish_counters()
        for outcome in transition.outcomes:
            round_, members = outcome.round, outcome.participants
            # The record names the membership committed (a digest, not the
            # list): a log of these is what split-brain checks compare. It is
            # written before any node is told, so every round a node returns
            # has one, even if this process ends as its answers go out.
            log_event(
                log,
                logging.INFO,
                "round_complete",
                f"round {round_} complete with {len(members)} nodes (epoch {self._tenure.epoch})",
                run_id=self.board.run_id,
                node=self.node,
                round_=round_,
                participants=members,
            )
            started = time.monotonic()
            self.board.publish(outcome, functools.partial(self._bootstrap_for, outcome))
            self._event(
                logging.INFO,
                "round_published",
                f"round {round_} published",
                round_,
                duration=time.monotonic() - started,  # the roster, answers, outcome
            )
        self._tenure.hint(self._round_hint())

    def _bootstrap_for(self, outcome: RoundOutcome) -> RendezvousStoreInfo | None:
        """The workers' bootstrap store of ``outcome``'s round, hosted here when this
        node is a participant (its agent runs the round's workers); ``None`` makes
        rank 0 host it."""
        if self._bootstrap is None or self.node not in outcome.participants:
            return None
        try:
            return self._bootstrap.serve(outcome.round, self._keep_alive_while_hosting, self._tick)
        except RendezvousError as exc:
            self._event(
                logging.WARNING,
                "bootstrap_not_hosted",
                f"steward {self.node} cannot host the workers' bootstrap store of round "
                f"{outcome.round}; rank 0 hosts it: {exc}",
                outcome.round,
            )
            return None

    def _keep_alive_while_hosting(self, now: float) -> None:
        self._beat_if_due()

    def _publish_counters(self) -> None:
        state = self._state
        present = frozenset(self._present)
        if self._liveness_report is None and present != self._reported_present:
            # With sessions the report changes with the membership, not per interval.
            self._liveness_report = encode_liveness(LivenessReport({}, present))
        self._reported_present = present
        self.board.publish_counters(
            waiting=len(state.wait_list),
            pending=0 if state.complete else len(state.participants),
            liveness=self._liveness_report,
        )
        self._liveness_report = None

    def _round_hint(self) -> int:
        """The round a node joining now should wait for (published in the lease)."""
        return self._state.waiting_round

    def _update_last_call(self, now: float) -> None:
        if not needs_last_call(self._state, self.settings):
            self._last_call_at = None
        elif self._last_call_at is None:
            self._last_call_at = now + self.settings.timeout.last_call.total_seconds()

    def _event(
        self,
        level: int,
        action: str,
        message: str,
        round_: int | None = None,
        *,
        about: _NodeDesc | None = None,
        duration: float | None = None,
    ) -> None:
        """A record of this steward's, or ``about`` another node (named in its ``node`` field)."""
        log_event(
            log,
            level,
            action,
            message,
            run_id=self.board.run_id,
            node=self.node if about is None else about,
            round_=self._state.round if round_ is None else round_,
            duration=duration,
        )

    def _report(self, exc: RendezvousStateError) -> None:
        """Tell the nodes waiting for the next rounds that nobody can decide them."""
        with contextlib.suppress(RendezvousError):
            first = self.board.read_lease().round
            for round_ in (first, first + 1):
                failed = RoundOutcome(round_, closed=False, error=str(exc))
                self.board.publish(failed)
