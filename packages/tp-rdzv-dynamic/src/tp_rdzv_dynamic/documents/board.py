"""Reading and writing the keys through which the nodes and the steward talk.

I/O only: the keys are :mod:`.layout`'s, the documents :mod:`.documents`'.
Every store failure leaves this module as a
:class:`~tp_rdzv_api.RendezvousConnectionError` naming the run, so callers
deal with one exception type.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Final, TypeVar

from tp_rdzv_api import RendezvousConnectionError, RendezvousStateError, RendezvousStoreInfo
from tp_rdzv_dynamic.model.decisions import Join, Message
from tp_rdzv_dynamic.model.gone import Gone
from tp_rdzv_dynamic.model.node_desc import _NodeDesc
from tp_rdzv_dynamic.model.state import RoundOutcome
from tp_rdzv_dynamic.quoting import quoted
from tp_store import Store, StoreError, StoreSession, StoreTimeoutError, UnsupportedOperationError

from .answers import Roster, Seat, answers, decode_answer, decode_roster, encode_roster
from .bootstrap_address import decode_bootstrap_address, encode_bootstrap_address
from .codecs import (
    WAKE_MESSAGE,
    Lease,
    Mail,
    decode_message,
    decode_outcome,
    encode_message,
    encode_outcome,
)
from .layout import RunLayout

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class Vacated(enum.Enum):
    """The type of :data:`VACATED`."""

    VACATED = "vacated"


#: What :meth:`RendezvousBoard.await_round` and :meth:`~RendezvousBoard.await_bootstrap`
#: answer when the steward left the lease vacant before what they wait for came.
VACATED: Final = Vacated.VACATED


class Stale(enum.Enum):
    """The type of :data:`STALE`."""

    STALE = "stale"


#: What :meth:`RendezvousBoard.await_bootstrap` answers when the round went stale
#: before its rank 0 published the workers' bootstrap store.
STALE: Final = Stale.STALE

#: The most messages the steward takes from the mailbox before deciding.
MAX_BATCH = 4096
#: The most answers the steward writes in one request (a few dozen bytes each).
ANSWER_BATCH = 2048


class RendezvousBoard:
    """The side channels of one run on one store connection (not thread-safe)."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.keys = RunLayout(run_id)
        #: Whether the store can wait for either of two keys (until it said it cannot).
        self.waits_for_either = True

    @contextmanager
    def _store_errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except StoreError as exc:
            raise RendezvousConnectionError(
                f"rendezvous {self.run_id!r}: the store failed while {what}: {exc}"
            ) from exc

    def _call(self, what: str, operation: Callable[[], _T]) -> _T:
        with self._store_errors(what):
            return operation()

    def clone(self, what: str) -> RendezvousBoard:
        """A board on a new connection of its own to the same store, for ``what``."""
        with self._store_errors(f"opening {what}"):
            return RendezvousBoard(self.store.clone(), self.run_id)

    def open_session(self, timeout: float, what: str) -> StoreSession | None:
        """A store session for ``what`` ending after ``timeout`` seconds of silence;
        ``None`` if the store offers none (then liveness falls back to counters)."""
        with self._store_errors(f"opening {what}"):
            try:
                return self.store.open_session(timeout)
            except UnsupportedOperationError:
                return None

    def attach_session(self, timeout: float, what: str) -> StoreSession | None:
        """:meth:`open_session` on this board's own connection (no connection more);
        ``None`` if the store offers no sessions."""
        with self._store_errors(f"opening {what}"):
            try:
                return self.store.attach_session(timeout)
            except UnsupportedOperationError:
                return None

    # -- presence: ephemeral keys and wills -------------------------------------
    def be_present(self, session: StoreSession, node: _NodeDesc, token: str) -> None:
        """Make ``node`` present through ``session``: its key holds ``token`` while the
        session lives, and the session's will tells the steward it is gone."""
        gone = encode_message(Gone(node, token))
        with self._store_errors("announcing this node's presence"):
            session.set_with_will(self.keys.presence(node.key), token, self.keys.mailbox, gone)

    def enter(
        self,
        session: StoreSession,
        node: _NodeDesc,
        token: str,
        join: Join,
        claim: bytes | None = None,
    ) -> Lease | None:
        """:meth:`be_present`, :meth:`read_lease` and :meth:`post` ``join``, in one request
        where the store can; ``None``, with nothing done, where it cannot. The
        lease is what it held before the join was posted: as it was posted on
        etcd (one transaction), read just before it on a tp-store server; if it
        was missing, the request wrote ``claim`` there (if given), and that is
        returned."""
        gone = encode_message(Gone(node, token))
        with self._store_errors("announcing this node and posting its join"):
            try:
                raw = session.set_with_will_push_and_get(
                    self.keys.presence(node.key),
                    token,
                    self.keys.mailbox,
                    gone,
                    push_onto=self.keys.mailbox,
                    push=encode_message(join),
                    get=self.keys.lease,
                    claim=claim,
                )
            except UnsupportedOperationError:
                return None
        return Lease.parse(b"" if raw is None else raw)  # missing: vacant, created by the taker

    def present_again(self, gone: Gone) -> bool:
        """Whether ``gone.node`` is present through another session than ``gone.token``'s.

        One round trip that never waits: a compare-and-set of the presence
        key from the token to itself returns what the key holds, and the
        token itself when it is missing (the usual case: the store deleted it).
        """
        key, token = self.keys.presence(gone.node.key), gone.token
        held = self._call("checking a departure", lambda: self.store.compare_set(key, token, token))
        return held != token.encode()

    def all_present(self, nodes: Sequence[_NodeDesc]) -> bool:
        """Whether every one of ``nodes`` has a presence key (one round trip)."""
        keys = [self.keys.presence(node.key) for node in nodes]
        return self._call("checking presence", lambda: self.store.check(keys)) if keys else True

    def leave_vacancy_will(self, session: StoreSession, epoch: int) -> None:
        """Have the end of ``session``, which holds the lease at ``epoch``, push that
        epoch's vacancy key (raises the session's errors: the caller owns it)."""
        session.add_will(self.keys.vacated(epoch), "1")

    def mark_stale_when_ended(self, session: StoreSession, round_: int) -> None:
        """Have ``session``'s end mark the completed ``round_`` stale (a will pushing onto
        its stale key, which ``wait`` and ``check`` then find)."""
        key = self.keys.stale(round_)
        with self._store_errors(f"leaving round {round_}'s stale mark as a will"):
            session.add_will(key, "1")

    # -- what every node does -------------------------------------------------
    def beat(self, node: _NodeDesc) -> int:
        """One heartbeat of ``node``; returns its counter, which only the node moves.

        A counter that went down was reset by a steward that found the node
        dead (:meth:`reset_heartbeats`).
        """
        return self._call(
            "sending a heartbeat", lambda: self.store.add(self.keys.heartbeat(node.key), 1)
        )

    def reset_heartbeats(self, nodes: Sequence[_NodeDesc]) -> None:
        """Set the counters of ``nodes``, found dead, back to zero (one round trip).

        Zero, not deleted: a sample of a node still named in a state waits
        for its counter to exist.
        """
        keys = [self.keys.heartbeat(node.key) for node in nodes]
        with self._store_errors("resetting heartbeats"):
            self.store.multi_set(keys, [b"0"] * len(keys))

    def post(self, event: Message, receipt: str | None = None) -> None:
        """Put ``event`` in the mailbox for the steward."""
        message, mailbox = encode_message(event, receipt), self.keys.mailbox
        self._call("posting to the mailbox", lambda: self.store.queue_push(mailbox, message))

    def is_closed(self) -> bool:
        """Whether the rendezvous has been closed."""
        return self._call("checking for closure", lambda: self.store.check([self.keys.closed]))

    def waiting(self) -> int:
        """The number of nodes in the wait list."""
        return self._call("reading the wait list", lambda: self.store.add(self.keys.waiting, 0))

    def pending(self) -> int:
        """The number of nodes gathered in the open round."""
        return self._call("reading the open round", lambda: self.store.add(self.keys.pending, 0))

    def await_round(
        self, round_: int, node: _NodeDesc, timeout: float, vacancy: int | None = None
    ) -> Seat | RoundOutcome | Vacated | None:
        """What ends ``node``'s wait for ``round_``; ``None`` after ``timeout`` seconds.

        Its seat once the round completed with it; the round's outcome
        otherwise (closed, an error, or complete without it); or, with
        ``vacancy`` (an epoch), :data:`VACATED` first if the steward of that
        epoch left the lease vacant.

        One request where the store waits for the first of several keys: the
        node's answer (written before the outcome, so a seated node never
        reads the outcome), the outcome, the vacancy. Elsewhere (and from the
        moment a store says it cannot: then ``None`` at once, and
        :attr:`waits_for_either` false) the outcome, then the seat: two
        requests, and no vacancy.
        """
        if not self.waits_for_either:
            return self._await_outcome_then_seat(round_, node, timeout)
        answer, outcome = self.keys.answer(round_, node.key), self.keys.outcome(round_)
        first = self._first_of([answer, outcome], vacancy, timeout, f"waiting for round {round_}")
        if first is None:
            return None
        found, raw = first
        if found == 0:
            return _seat(raw, answer, round_)
        if found == 1:
            return decode_outcome(raw, outcome)
        return VACATED

    def _first_of(
        self, keys: list[str], vacancy: int | None, timeout: float, what: str
    ) -> tuple[int, bytes] | None:
        """The index and value of the first of ``keys`` and, with ``vacancy`` (an
        epoch), that epoch's vacancy key (last) to exist; ``None`` after
        ``timeout`` seconds, or at once when the store says it cannot wait for
        either (then :attr:`waits_for_either` is false)."""
        if vacancy is not None:
            keys = [*keys, self.keys.vacated(vacancy)]
        with self._store_errors(what):
            try:
                return self.store.wait_any(keys, timeout)
            except StoreTimeoutError:
                return None
            except UnsupportedOperationError:
                self.waits_for_either = False
                return None

    def _await_outcome_then_seat(
        self, round_: int, node: _NodeDesc, timeout: float
    ) -> Seat | RoundOutcome | None:
        key = self.keys.outcome(round_)
        with self._store_errors(f"waiting for round {round_}"):
            try:
                raw = self.store.wait_get(key, timeout)
            except StoreTimeoutError:
                return None
        outcome = decode_outcome(raw, key)
        if outcome.error is not None or outcome.closed:
            return outcome
        seat = self.read_seat(outcome.round, node)
        if seat is None:
            return outcome
        if seat.world_size != outcome.world_size:
            raise RendezvousStateError(
                f"round {outcome.round} has {outcome.world_size} nodes, but the "
                f"answer to {node} says {seat.world_size}"
            )
        return seat

    # -- the workers' bootstrap store ---------------------------------------------
    def publish_bootstrap(self, round_: int, info: RendezvousStoreInfo) -> RendezvousStoreInfo:
        """Tell the nodes of ``round_`` where its workers' store is (one key, written
        once): ``info``, or the store published first (by a steward, or by rank 0
        on reading an answer written before a steward published one)."""
        key, document = self.keys.bootstrap(round_), encode_bootstrap_address(info)
        there = self._call(
            "publishing the bootstrap store", lambda: self.store.compare_set(key, "", document)
        )
        return info if there == document else decode_bootstrap_address(there, key)

    def await_bootstrap(
        self, round_: int, timeout: float, vacancy: int | None = None
    ) -> RendezvousStoreInfo | Stale | Vacated | None:
        """The bootstrap store rank 0 of ``round_`` published; ``None`` after ``timeout``
        seconds.

        One request where the store waits for the first of several keys: the
        address, the round's stale mark (:data:`STALE`: a node of the round
        left before the address came, rank 0 perhaps) and, with ``vacancy``
        (an epoch), the steward's vacancy (:data:`VACATED`). Elsewhere (and
        from the moment a store says it cannot: then ``None`` at once, and
        :attr:`waits_for_either` false) the address alone.
        """
        key, what = self.keys.bootstrap(round_), "waiting for the bootstrap store's address"
        if not self.waits_for_either:
            with self._store_errors(what):
                try:
                    raw = self.store.wait_get(key, timeout)
                except StoreTimeoutError:
                    return None
            return decode_bootstrap_address(raw, key)
        first = self._first_of([key, self.keys.stale(round_)], vacancy, timeout, what)
        if first is None:
            return None
        found, raw = first
        if found == 0:
            return decode_bootstrap_address(raw, key)
        return STALE if found == 1 else VACATED

    def has_bootstrap(self, round_: int) -> bool:
        """Whether rank 0 of ``round_`` has published its bootstrap store (no waiting)."""
        key = self.keys.bootstrap(round_)
        return self._call("checking for the bootstrap store", lambda: self.store.check([key]))

    def await_stale(self, round_: int, timeout: float) -> bool:
        """Whether the completed ``round_`` turns stale within ``timeout`` seconds."""
        return self._appears(self.keys.stale(round_), timeout, f"watching round {round_}")

    def is_stale(self, round_: int) -> bool:
        """Whether the completed ``round_`` is stale now (no waiting)."""
        key = self.keys.stale(round_)
        return self._call(f"watching round {round_}", lambda: self.store.check([key]))

    def mark_stale(self, round_: int) -> None:
        """Tell the nodes of the completed ``round_`` that membership changed."""
        self._call(
            f"marking round {round_} stale", lambda: self.store.set(self.keys.stale(round_), "1")
        )

    def observe(self) -> tuple[Lease | None, bytes | None]:
        """The lease and the steward's last liveness report, each ``None`` when absent.

        Read-only, for observers: unlike :meth:`read_lease` it creates nothing.
        """
        with self._store_errors("reading the steward's reports"):
            lease, liveness = (
                self.store.get(key) if self.store.check([key]) else None
                for key in (self.keys.lease, self.keys.liveness)
            )
        return (None if lease is None else Lease.parse(lease)), liveness

    def read_lease(self) -> Lease:
        """The steward lease (created vacant if missing), in one round trip."""
        key = self.keys.lease
        raw = self._call("reading the lease", lambda: self.store.compare_set(key, "", ""))
        return Lease.parse(raw)

    def swap_lease(self, seen: bytes, desired: bytes) -> bytes:
        """Replace the lease if it still holds ``seen``; what it holds afterwards."""
        return self._call(
            "taking the lease", lambda: self.store.compare_set(self.keys.lease, seen, desired)
        )

    def await_receipt(self, receipt: str, timeout: float) -> bool:
        """Whether the steward confirmed ``receipt`` within ``timeout`` seconds."""
        return self._appears(self.keys.receipt(receipt), timeout, "waiting for a receipt")

    def _appears(self, key: str, timeout: float, what: str) -> bool:
        """Whether ``key`` exists within ``timeout`` seconds."""
        with self._store_errors(what):
            try:
                self.store.wait([key], timeout)
            except StoreTimeoutError:
                return False
        return True

    def claim_closing(self, node: _NodeDesc) -> bool:
        """Whether ``node`` is the one to record the closing (the first to ask)."""
        key = self.keys.closing
        held = self._call("claiming the closing", lambda: self.store.compare_set(key, "", node.key))
        return held == node.key.encode()

    def await_closed(self, timeout: float) -> bool:
        """Whether the rendezvous is marked closed within ``timeout`` seconds."""
        return self._appears(self.keys.closed, timeout, "waiting for the closing")

    def close(self) -> None:
        """Mark the rendezvous closed (the key only; the state is the backend's)."""
        self._call("closing", lambda: self.store.set(self.keys.closed, "1"))

    def publish(
        self,
        outcome: RoundOutcome,
        bootstrap: Callable[[], RendezvousStoreInfo | None] | None = None,
    ) -> bytes:
        """Publish ``outcome`` unless one is there for its round; return what is there.

        A completed round's roster and answers are written first (in
        :data:`ANSWER_BATCH`-sized requests): a node woken by the outcome finds
        its answer. Once the outcome is there they are never written again: a
        steward taking office publishes the round of its state again, whose
        participants may have left since the nodes were told (what the nodes
        were told stays what the store holds). Written and not followed by an
        outcome (a steward died between), they are written whole again.

        ``bootstrap()``, called only when the answers are written, is the
        workers' bootstrap store the publisher hosts for the round (``None``:
        rank 0 publishes one). The round's first address wins
        (:meth:`publish_bootstrap`): every answer names the same store as
        ``bootstrap/<round>``, whoever published first.
        """
        round_ = outcome.round
        key = self.keys.outcome(round_)
        with self._store_errors(f"publishing round {round_}"):
            if self.store.check([key]):
                return self.store.get(key)
            if not outcome.closed and outcome.error is None:
                self.store.set(self.keys.roster(round_), encode_roster(outcome))
                hosted = bootstrap() if bootstrap is not None else None
                if hosted is not None:
                    hosted = self.publish_bootstrap(round_, hosted)
                seats = answers(outcome, hosted)
                for start in range(0, len(seats), ANSWER_BATCH):
                    chunk = seats[start : start + ANSWER_BATCH]
                    keys = [self.keys.answer(round_, node.key) for node, _ in chunk]
                    self.store.multi_set(keys, [answer for _, answer in chunk])
            return self.store.compare_set(key, "", encode_outcome(outcome))

    def read_seat(self, round_: int, node: _NodeDesc) -> Seat | None:
        """``node``'s answer in the completed ``round_``; ``None`` if it was not seated.

        One round trip that never waits (read after the outcome, which is
        written after every answer): a compare-and-set from empty to empty
        returns the answer, or empty when there is none.
        """
        key = self.keys.answer(round_, node.key)
        raw = self._call(f"reading round {round_}", lambda: self.store.compare_set(key, "", ""))
        return _seat(raw, key, round_) if raw else None

    def read_roster(self, round_: int) -> Roster:
        """The lists of the completed ``round_`` (written before its outcome)."""
        key = self.keys.roster(round_)
        raw = self._call(f"reading round {round_}'s roster", lambda: self.store.get(key))
        return decode_roster(raw, key)

    # -- what only the steward does -------------------------------------------
    def await_mail(self, timeout: float) -> bool:
        """Whether the mailbox holds a message within ``timeout`` seconds."""
        return self._appears(self.keys.mailbox, timeout, "waiting for the mailbox")

    def take_mail(self) -> list[tuple[Mail | None, str | None]]:
        """Up to :data:`MAX_BATCH` mailbox messages; a malformed one is logged (a line) and dropped.

        Two round trips however many there are: the queue's length, then that
        many pops pipelined (one round trip per message made a storm of joins
        cost the steward seconds).
        """
        messages: list[tuple[Mail | None, str | None]] = []
        mailbox = self.keys.mailbox
        with self._store_errors("reading the mailbox"):
            queued = self.store.queue_len(mailbox)
            raws = self.store.queue_pop_many(mailbox, min(queued, MAX_BATCH))
        for raw in raws:
            try:
                messages.append(decode_message(raw))
            except Exception as exc:  # one message, whatever it holds, is dropped
                # decode_message raises ValueError only (its property tests hold it to
                # that); anything else is a bug to report, not a reason to stop deciding.
                log.warning(
                    "rendezvous %r: dropped a malformed mailbox message %s: %s: %s",
                    self.run_id,
                    quoted(raw),
                    type(exc).__name__,
                    exc,
                )
        return messages

    def put_back(self, messages: Sequence[tuple[Mail, str | None]]) -> None:
        """Return ``messages`` taken from the mailbox to it, each with its receipt.

        For a steward that stopped (lost the lease) before persisting them:
        the steward in office decides them (at the back of the queue) and
        confirms the receipts. One round trip, after the pushes (which have no reply), so
        they have landed when this returns.
        """
        mailbox = self.keys.mailbox
        with self._store_errors("returning messages to the mailbox"):
            for event, receipt in messages:
                self.store.queue_push(mailbox, encode_message(event, receipt))
            self.store.queue_len(mailbox)

    def sample_heartbeats(
        self, nodes: Sequence[_NodeDesc], unseen: Sequence[_NodeDesc] = ()
    ) -> list[bytes]:
        """The heartbeat counters of ``nodes``, without waiting for any.

        Honest nodes beat before they post, but a forged join names a node
        whose counter never appears, and ``multi_get`` waits for every key:
        so the counters of ``unseen`` nodes (those not sampled before) are
        checked first, in one round trip, and created as ``0`` when missing.
        A created counter that never moves makes its node dead after the
        liveness bound, like any silent node.
        """
        keys = [self.keys.heartbeat(node.key) for node in nodes]
        new = [self.keys.heartbeat(node.key) for node in unseen]
        with self._store_errors("reading heartbeats"):
            if new and not self.store.check(new):
                for key in new:
                    self.store.add(key, 0)
            return self.store.multi_get(keys) if keys else []

    def publish_counters(self, waiting: int, pending: int, liveness: bytes | None = None) -> None:
        """Publish the counters nodes read with ``add(key, 0)``, and a liveness report."""
        keys = [self.keys.waiting, self.keys.pending]
        values: list[str | bytes] = [str(waiting), str(pending)]
        if liveness is not None:
            keys.append(self.keys.liveness)
            values.append(liveness)
        self._call("publishing counters", lambda: self.store.multi_set(keys, values))

    def wake(self) -> None:
        """Wake a steward blocked on the mailbox (it ignores the message)."""
        self._call(
            "waking the steward", lambda: self.store.queue_push(self.keys.mailbox, WAKE_MESSAGE)
        )

    def confirm(self, receipts: Sequence[str]) -> None:
        """Confirm that the messages carrying ``receipts`` are persisted."""
        if receipts:
            keys = [self.keys.receipt(receipt) for receipt in receipts]
            self._call("confirming receipts", lambda: self.store.multi_set(keys, ["1"] * len(keys)))


def _seat(raw: bytes, key: str, round_: int) -> Seat:
    """The answer ``raw`` read at ``key``, which must be for ``round_``."""
    seat = decode_answer(raw, key)
    if seat.round != round_:
        raise RendezvousStateError(
            f"the rendezvous document at {key} answers for round {seat.round}"
        )
    return seat
