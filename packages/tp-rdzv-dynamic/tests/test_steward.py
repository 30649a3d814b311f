"""The steward thread on a real store: what it took from the mailbox when it lost the lease.

Found by the chaos suite (a ``complete`` trial on a loaded machine): a steward
frozen past the liveness bound was taken over while its thread lived on, and
drained the joins the survivors posted to the new steward. It lost them with
the lease, and the survivors, who post a join again only when the lease's epoch
moves, waited out their join timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from tp_rdzv_dynamic import TpRendezvousBackend
from tp_rdzv_dynamic.backends.holder import _RendezvousStateHolder
from tp_rdzv_dynamic.documents.board import RendezvousBoard
from tp_rdzv_dynamic.documents.codecs import Lease, decode_outcome
from tp_rdzv_dynamic.model.decisions import Join, Leave, Message
from tp_rdzv_dynamic.model.node_desc import _NodeDesc
from tp_rdzv_dynamic.settings import RendezvousSettings
from tp_rdzv_dynamic.steward.office import StewardOffice
from tp_rdzv_dynamic.steward.steward import Steward
from tp_rdzv_dynamic.steward.tenure import Tenure
from tp_store import TCPStore

RUN = "steward"
OLD, NEW, JOINER, LEAVER = (_NodeDesc("127.0.0.1", pid, 0) for pid in (1, 2, 3, 4))
# Long ticks: the old steward scans every 10 s and beats every 40 s, so only the
# drain itself can tell it that it lost the lease; and nobody is found dead.
# One join is enough for a round, which completes at the last call (so the join
# alone is not persisted at once).
SETTINGS = RendezvousSettings(
    RUN,
    min_nodes=1,
    max_nodes=2,
    last_call=timedelta(seconds=0.3),
    keep_alive_interval=40,
    keep_alive_max_attempt=2,
)
WAIT = 30.0  # generous bounds for a loaded machine: a pass never waits this long


class UsurpedBoard(RendezvousBoard):
    """A steward's board on which another node takes the lease as the steward drains.

    ``usurp`` runs once, in the steward's thread, just before its first
    drain: the interleaving of a steward that froze past the liveness bound,
    was taken over, and woke to find mail posted to its successor.
    """

    def __init__(self, store: TCPStore, usurp: Callable[[], None]) -> None:
        super().__init__(store, RUN)
        self._usurp = usurp
        self.drained = threading.Event()

    def take_mail(self) -> list[tuple[Message | None, str | None]]:
        if not self.drained.is_set():
            self._usurp()
        try:
            return super().take_mail()
        finally:
            self.drained.set()


def holder_on(store: TCPStore) -> _RendezvousStateHolder:
    return _RendezvousStateHolder(TpRendezvousBackend(store, RUN), RUN)


def take_over(server: TCPStore) -> None:
    """What a node taking over does first: a higher epoch in the lease, then in the state.

    As :meth:`StewardOffice._take` and its steward's ``_take_office`` do;
    the state stamped with the new epoch fences the old steward's writes out.
    """
    store = server.clone()
    try:
        board = RendezvousBoard(store, RUN)
        lease = board.read_lease()
        epoch = lease.epoch + 1
        desired = Lease.encode(epoch, NEW.key, 0, lease.round)
        assert board.swap_lease(lease.raw, desired) == desired
        holder = holder_on(store)
        state, token = holder.load()
        state.epoch = epoch
        assert holder.save(state, token)[2]
    finally:
        store.close()


@pytest.fixture
def old_steward(server: TCPStore) -> Iterator[tuple[Steward, UsurpedBoard]]:
    """A steward in office (epoch 1) whose lease is taken over before its first drain."""
    board = UsurpedBoard(server.clone(), lambda: take_over(server))
    vacant = board.read_lease()
    taken = Lease.encode(vacant.epoch + 1, OLD.key, 0, vacant.round)
    assert board.swap_lease(vacant.raw, taken) == taken
    steward = Steward(
        OLD, SETTINGS, board, holder_on(server.clone()), Tenure(board, OLD.key, taken, 10.0)
    )
    steward.start()
    # Its first scan is done when it publishes a liveness report: the mail
    # posted after is drained by a step of its own, with no scan due.
    server.wait([f"tp_rdzv/{RUN}/liveness"], WAIT)
    yield steward, board
    waker = server.clone()
    steward.stop(RendezvousBoard(waker, RUN))
    waker.close()


@pytest.mark.parametrize("with_leave", [False, True], ids=["join", "join and leave"])
def test_mail_taken_after_the_lease_was_lost_goes_to_the_new_steward(
    server: TCPStore, old_steward: tuple[Steward, UsurpedBoard], with_leave: bool
) -> None:
    steward, old_board = old_steward
    node_store = server.clone()
    board = RendezvousBoard(node_store, RUN)
    board.post(Join(JOINER, None, 0))
    receipt = board.keys.new_receipt(LEAVER.key, 1)
    if with_leave:
        board.post(Leave(LEAVER), receipt)  # e.g. a node rolling back a timed-out join
    assert old_board.drained.wait(WAIT)

    # The node that took the lease starts its steward only now: the old one drained first.
    new_store = server.clone()
    office = StewardOffice(NEW, SETTINGS, RendezvousBoard(new_store, RUN), holder_on(new_store))
    try:
        assert office.watch(time.monotonic()).holder == NEW.key
        outcome = decode_outcome(server.wait_get(f"tp_rdzv/{RUN}/result/0", WAIT), "result/0")
        assert outcome.world_size == 1
        assert board.read_roster(0).participants == (JOINER,)
        if with_leave:
            # Confirmed by the steward that persisted it, not lost with the old one.
            assert board.await_receipt(receipt, WAIT)
        steward._thread.join(WAIT)
        assert not steward.running  # it stopped deciding at the drain
    finally:
        office.stop()
        new_store.close()
        node_store.close()
