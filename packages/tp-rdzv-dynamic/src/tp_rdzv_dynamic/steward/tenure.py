"""The steward's hold on the lease: every write of it after the takeover, fenced.

Its own module so that the office (which takes the lease and starts the
steward) and the steward (which keeps it) both use it without importing each
other.

On a store with sessions the steward holds the lease through a store session
of its own: the store deletes the lease the moment that session ends (the
steward's process died, or froze past the liveness bound), so the lease is
vacant at once instead of after a silence. The session's wills mark the
completed round stale then, which wakes the agents in ``wait_for_change``,
and push the epoch's vacancy key, which wakes the nodes waiting for a round
(they wait for either their round's outcome or that key: no node ticks to
watch a lease held through a session). A vacancy key, once pushed, stays:
each epoch's lease is held through one session, and a new session takes the
next epoch.
"""

from __future__ import annotations

import contextlib

from tp_rdzv_api import RendezvousConnectionError
from tp_rdzv_dynamic.documents.board import RendezvousBoard
from tp_rdzv_dynamic.documents.codecs import SESSION_BEAT, Lease
from tp_store import SessionExpiredError, StoreError, StoreSession

#: Wills one steward session holds at most: a round's will is added when the
#: round completes, and a full session is replaced by a fresh one. Every will
#: but the newest marks an older round, stale by then anyway.
WILLS_PER_SESSION = 16


class LeaseLost(Exception):
    """Another node holds the lease now: this steward must stop deciding."""


class Tenure:
    """The lease as its holder keeps it, on the steward's own board.

    Every write raises :class:`LeaseLost` when the lease no longer
    holds what this holder last wrote: another node took it, or the store
    ended the session it was held through.

    Args:
        board: the steward's board.
        holder: the holding node's key.
        lease: the value the holder wrote when it took the lease.
        timeout: the liveness bound: a session of the steward ends after that
            long without a word from it.
    """

    def __init__(self, board: RendezvousBoard, holder: str, lease: bytes, timeout: float) -> None:
        taken = Lease.parse(lease)
        self._board = board
        self._holder = holder
        self._raw = lease
        self._beat = 0
        self._timeout = timeout
        self._session: StoreSession | None = None
        self._wills = 0
        # The session and epoch whose vacancy will was left last.
        self._vacancy_will: tuple[StoreSession, int] | None = None
        self.epoch = taken.epoch
        #: The round the lease tells joiners to wait for.
        self.round = taken.round

    @property
    def lease(self) -> Lease:
        """The lease as this holder last wrote it."""
        return Lease.parse(self._raw)

    @property
    def session_held(self) -> bool:
        """Whether the lease is held through a store session (vacant when it ends)."""
        return self._session is not None

    def hold_through_session(self) -> bool:
        """Hold the lease through a store session from now on; whether the store has them.

        The lease was taken by a plain compare-and-set (losing the race then
        costs no session); a holder that died before this point leaves a
        lease that waiters judge by its silence, as on stores without sessions.
        """
        return self._hold(self.epoch)

    def _hold(self, epoch: int) -> bool:
        """Hold the lease at ``epoch`` through a new session (:meth:`hold_through_session`)."""
        session = self._board.open_session(self._timeout, "the steward's session")
        if session is None:
            return False
        self._wills = 0
        try:
            self._write(epoch, self._holder, SESSION_BEAT, self.round, session)
        except BaseException:
            with contextlib.suppress(StoreError):
                session.close()
            raise
        self._session = session
        return True

    def beat(self, round_: int) -> None:
        """Move the lease's beat (waiters judge the steward alive by it), hinting ``round_``.

        Held through a session, the lease does not beat: the write checks that
        it is still this holder's.
        """
        if self._session is None:
            self._write(self.epoch, self._holder, self._beat + 1, round_)
        else:
            self._write(self.epoch, self._holder, SESSION_BEAT, round_)

    def hint(self, round_: int) -> None:
        """Tell joiners to wait for ``round_``, unless the lease already does."""
        if round_ != self.round:
            self.beat(round_)

    def move_past(self, epoch: int, round_: int) -> None:
        """Take the epoch after ``epoch`` (a state stamped by ``epoch`` fences this one out)."""
        beat: int | str = self._beat if self._session is None else SESSION_BEAT
        self._write(epoch + 1, self._holder, beat, round_)

    def keep_alive(self) -> None:
        """Tell the store the steward lives (a ping of its session; nothing without one)."""
        if self._session is not None:
            try:
                self._session.keep_alive()
            except SessionExpiredError as exc:
                raise LeaseLost from exc
            except StoreError as exc:
                raise self._store_error("keeping the steward's session alive", exc) from exc

    def mark_stale_when_ended(self, round_: int) -> None:
        """Have the completed ``round_`` marked stale if this steward's session ends.

        A full session is replaced first: the new one takes the lease over at
        the next epoch (a write moves its ownership), then the old one is
        closed, which pushes its wills: stale marks of older rounds, and the
        vacancy of the epoch before (its waiters wake, read the new epoch,
        and post their joins again to this steward, which takes them as repeats).
        """
        old = self._session
        if old is None:
            return
        if self._wills >= WILLS_PER_SESSION:
            self._session = None
            self._hold(self.epoch + 1)
            with contextlib.suppress(StoreError):
                old.close()
        if self._session is None:
            raise RendezvousConnectionError(
                f"rendezvous {self._board.run_id!r}: the store stopped offering sessions"
            )
        self._board.mark_stale_when_ended(self._session, round_)
        self._wills += 1

    def resign(self, round_: int) -> None:
        """Hand the lease back vacant, unless another node holds it already.

        A plain write: the vacant lease outlives this steward's session,
        keeping the epoch and the round hint for the next holder.
        """
        with contextlib.suppress(LeaseLost):
            desired = Lease.encode(self.epoch, "", self._beat + 1, round_)
            if self._board.swap_lease(self._raw, desired) != desired:
                raise LeaseLost
            self._raw = desired

    def close(self) -> None:
        """End the steward's session, if any (the store pushes its wills)."""
        session, self._session = self._session, None
        if session is not None:
            with contextlib.suppress(StoreError):
                session.close()

    def _write(
        self,
        epoch: int,
        holder: str,
        beat: int | str,
        round_: int,
        session: StoreSession | None = None,
    ) -> None:
        desired = Lease.encode(epoch, holder, beat, round_)
        session = session or self._session
        if session is None:
            held = self._board.swap_lease(self._raw, desired)
        else:
            try:
                if self._vacancy_will != (session, epoch):
                    # Left before the lease says it is held through the session: a
                    # node that reads so waits for this will.
                    self._board.leave_vacancy_will(session, epoch)
                    self._vacancy_will = (session, epoch)
                    self._wills += 1
                held = session.compare_set(self._board.keys.lease, self._raw, desired)
            except SessionExpiredError as exc:
                raise LeaseLost from exc
            except StoreError as exc:
                raise self._store_error("writing the lease", exc) from exc
        if held != desired:
            raise LeaseLost
        self._raw, self.epoch, self.round = desired, epoch, round_
        if isinstance(beat, int):
            self._beat = beat

    def _store_error(self, what: str, exc: StoreError) -> RendezvousConnectionError:
        return RendezvousConnectionError(
            f"rendezvous {self._board.run_id!r}: the store failed while {what}: {exc}"
        )
