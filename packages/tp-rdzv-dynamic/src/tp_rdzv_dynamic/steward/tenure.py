"""The steward's hold on the lease: every write of it after the takeover, fenced.

Its own module so that the office (which takes the lease and starts the
steward) and the steward (which keeps it) both use it without importing each
other.
"""

from __future__ import annotations

import contextlib

from tp_rdzv_dynamic.documents.board import RendezvousBoard
from tp_rdzv_dynamic.documents.codecs import Lease


class LeaseLost(Exception):
    """Another node holds the lease now: this steward must stop deciding."""


class Tenure:
    """The lease as its holder keeps it, on the steward's own board.

    Every write raises :class:`LeaseLost` when the lease no longer
    holds what this holder last wrote: another node took it.

    Args:
        board: the steward's board.
        holder: the holding node's key.
        lease: the value the holder wrote when it took the lease.
    """

    def __init__(self, board: RendezvousBoard, holder: str, lease: bytes) -> None:
        taken = Lease.parse(lease)
        self._board = board
        self._holder = holder
        self._raw = lease
        self._beat = 0
        self.epoch = taken.epoch
        #: The round the lease tells joiners to wait for.
        self.round = taken.round

    def beat(self, round_: int) -> None:
        """Move the lease's beat (waiters judge the steward alive by it), hinting ``round_``."""
        self._write(self.epoch, self._holder, self._beat + 1, round_)

    def hint(self, round_: int) -> None:
        """Tell joiners to wait for ``round_``, unless the lease already does."""
        if round_ != self.round:
            self.beat(round_)

    def move_past(self, epoch: int, round_: int) -> None:
        """Take the epoch after ``epoch`` (a state stamped by ``epoch`` fences this one out)."""
        self._write(epoch + 1, self._holder, self._beat, round_)

    def resign(self, round_: int) -> None:
        """Hand the lease back vacant, unless another node holds it already."""
        with contextlib.suppress(LeaseLost):
            self._write(self.epoch, "", self._beat + 1, round_)

    def _write(self, epoch: int, holder: str, beat: int, round_: int) -> None:
        desired = Lease.encode(epoch, holder, beat, round_)
        if self._board.swap_lease(self._raw, desired) != desired:
            raise LeaseLost
        self._raw, self.epoch, self._beat, self.round = desired, epoch, beat, round_
