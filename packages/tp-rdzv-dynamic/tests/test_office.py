"""The steward office: the lease on this node's clock, takeover, re-posting, the steward's life."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tp_rdzv_dynamic import TpRendezvousBackend
from tp_rdzv_dynamic.backends.holder import _RendezvousStateHolder
from tp_rdzv_dynamic.documents.answers import Seat
from tp_rdzv_dynamic.documents.board import RendezvousBoard
from tp_rdzv_dynamic.documents.codecs import Lease, decode_outcome
from tp_rdzv_dynamic.model.decisions import Join
from tp_rdzv_dynamic.model.node_desc import _NodeDesc
from tp_rdzv_dynamic.settings import RendezvousSettings
from tp_rdzv_dynamic.steward.office import StewardOffice
from tp_rdzv_dynamic.steward.tenure import LeaseLost, Tenure
from tp_store import TCPStore

RUN = "office"
LEASE = f"tp_rdzv/{RUN}/steward"
NODE = _NodeDesc("127.0.0.1", 7, 0)
# A liveness bound of 3 s: the tests pass their own clock readings to watch().
SETTINGS = RendezvousSettings(RUN, 1, 1, keep_alive_interval=1, keep_alive_max_attempt=3)
BOUND = 3.0


@pytest.fixture
def office(server: TCPStore) -> Iterator[StewardOffice]:
    store = server.clone()
    board = RendezvousBoard(store, RUN)
    holder = _RendezvousStateHolder(TpRendezvousBackend(store, RUN), RUN)
    office = StewardOffice(NODE, SETTINGS, board, holder)
    yield office
    office.stop()
    store.close()


def write_lease(server: TCPStore, lease: bytes) -> None:
    """Set the lease as another node would, applied before the office reads it.

    A SET has no reply: the read on the same connection makes sure the server
    applied it before a request of the office's own connection arrives.
    """
    server.set(LEASE, lease)
    assert server.get(LEASE) == lease


def test_a_vacant_lease_is_taken_and_the_steward_decides(office, server):
    lease = office.watch(0.0)
    assert (lease.holder, lease.epoch) == (NODE.key, 1)
    assert office.running
    office.post(Join(NODE, None, 0))
    raw = server.wait_get(f"tp_rdzv/{RUN}/result/0", 30)
    assert decode_outcome(raw, "result/0").world_size == 1
    reader = RendezvousBoard(server, RUN)
    assert reader.read_seat(0, NODE) == Seat(round=0, rank=0, world_size=1)
    assert reader.read_roster(0).participants == (NODE,)
    office.stop()
    assert not office.running
    # Handed back vacant, at the same epoch: the next steward's is higher.
    stopped = Lease.parse(server.get(LEASE))
    assert (stopped.holder, stopped.epoch) == ("", 1)


def test_a_frozen_lease_is_taken_after_the_bound_and_the_join_goes_to_the_new_steward(
    office, server
):
    # A steward that took a join from the mailbox, then froze (its lease stopped moving).
    write_lease(server, Lease.encode(5, "ghost_1_0", 9, 0))
    assert office.watch(100.0).holder == "ghost_1_0"
    office.post(Join(NODE, None, 0))
    server.queue_pop(f"tp_rdzv/{RUN}/mailbox")  # the ghost drained it, and is gone
    join = Join(NODE, None, 0)
    assert office.watch(100.0 + BOUND - 0.5, rejoin=join).holder == "ghost_1_0"
    assert not office.running
    taken = office.watch(100.0 + BOUND, rejoin=join)
    assert (taken.holder, taken.epoch) == (NODE.key, 6)
    # The join the ghost took is decided by the new steward: it was posted again.
    raw = server.wait_get(f"tp_rdzv/{RUN}/result/0", 30)
    assert decode_outcome(raw, "result/0").world_size == 1
    reader = RendezvousBoard(server, RUN)
    assert reader.read_seat(0, NODE) == Seat(round=0, rank=0, world_size=1)
    assert reader.read_roster(0).participants == (NODE,)


def test_a_moving_lease_is_never_taken(office, server):
    for beat in range(5):
        write_lease(server, Lease.encode(2, "busy_1_0", beat, 0))
        assert office.watch(BOUND * beat).holder == "busy_1_0"
    assert not office.running


def test_a_tenure_stops_at_the_first_write_after_another_node_took_the_lease(server):
    store = server.clone()
    taken = Lease.encode(3, NODE.key, 0, 0)
    write_lease(server, taken)
    tenure = Tenure(RendezvousBoard(store, RUN), NODE.key, taken, 10.0)
    tenure.beat(0)
    tenure.hint(2)
    assert Lease.parse(server.get(LEASE)).round == 2
    usurper = Lease.encode(4, "usurper_1_0", 0, 2)
    write_lease(server, usurper)
    with pytest.raises(LeaseLost):
        tenure.beat(2)
    tenure.resign(2)  # leaves the usurper's lease alone
    assert server.get(LEASE) == usurper
    store.close()
